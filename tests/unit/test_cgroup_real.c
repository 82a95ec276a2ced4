/* zb_cgroup_cpuset and zb_allowed_cpus against the machine's real cpuset controller, not fake
 * files: a cgroup of the test's own with one CPU, the process moved into it, then read back.
 * cgroup v1 (the cpuset hierarchy) or v2 (the unified one, where a child that does not configure
 * cpuset.cpus is confined by its parent's: the case a Slurm task below its step is in). Needs root
 * and a cpuset controller at /sys/fs/cgroup/cpuset (v1) or /sys/fs/cgroup (v2, with cpuset in
 * cgroup.subtree_control or enabled here); elsewhere it exits 77 (skipped), which any non-empty CI
 * turns into a failure unless ZB_ALLOW_SKIP=1. debian_root.sh runs it in its cgroup v2 VM. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zenbind/zenbind.h>

#include "skip.h"

static int v2;             /* the unified hierarchy, else v1's cpuset one */
static char mount_dir[64]; /* where the cpuset controller is mounted */
static char home[1024];    /* this process's cgroup before the test, to go back */
static char outer[1100];   /* the test's cgroup: cpuset.cpus = the last allowed CPU */
static char inner[1200];   /* v2 only: a child of outer configuring no cpuset.cpus */
static int cpu;            /* that CPU */
static int other_cpu = -1; /* another allowed CPU, outside outer (-1: only one CPU) */

static int write_text(const char *dir, const char *file, const char *text) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int read_text(const char *dir, const char *file, char *out, size_t len) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    const int ok = fgets(out, (int)len, f) != NULL;
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
    return ok ? 0 : -1;
}

static int move_self(const char *dir) {
    char pid[32];
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    return write_text(dir, "cgroup.procs", pid);
}

/* This process's path in the hierarchy at mount_dir, from /proc/self/cgroup. */
static int own_path(char *out, size_t len) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[1024];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "0::PATH" (v2), or "ID:CONTROLLERS:PATH" with cpuset among the controllers (v1). */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        const int v2_line = strncmp(line, "0::", 3) == 0;
        *c2 = '\0';
        const int match = v2 ? v2_line : strstr(c1 + 1, "cpuset") != NULL;
        if (match) found = snprintf(out, len, "%s", c2 + 1) < (int)len ? 0 : -1;
    }
    fclose(f);
    return found;
}

static const char *setup(void) {
    struct stat st;
    if (stat("/sys/fs/cgroup/cpuset/cpuset.cpus", &st) == 0) {
        snprintf(mount_dir, sizeof mount_dir, "/sys/fs/cgroup/cpuset");
    } else if (stat("/sys/fs/cgroup/cgroup.controllers", &st) == 0) {
        v2 = 1;
        snprintf(mount_dir, sizeof mount_dir, "/sys/fs/cgroup");
    } else {
        return "no cpuset controller mounted at /sys/fs/cgroup(/cpuset)";
    }
    char path[512];
    if (own_path(path, sizeof path) != 0) return "cannot find this process in /proc/self/cgroup";
    snprintf(home, sizeof home, "%s%s", mount_dir, strcmp(path, "/") ? path : "");
    /* The test's cgroups go beside the process's own (v2 forbids processes in a cgroup with
     * children that enable controllers, so never below it). */
    snprintf(outer, sizeof outer, "%s/zb-cpuset-%d", v2 ? mount_dir : home, (int)getpid());
    if (v2) {
        char controllers[256] = "";
        read_text(mount_dir, "cgroup.subtree_control", controllers, sizeof controllers);
        if (!strstr(controllers, "cpuset") &&
            write_text(mount_dir, "cgroup.subtree_control", "+cpuset") != 0)
            return "cannot enable the cpuset controller in /sys/fs/cgroup (not root?)";
    }
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return "sched_getaffinity failed";
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) other_cpu = cpu, cpu = c;
    if (mkdir(outer, 0755) != 0) return "cannot create a cpuset cgroup (not root?)";
    char text[32];
    snprintf(text, sizeof text, "%d\n", cpu);
    /* v1 needs cpuset.mems too before a process may join. */
    if (write_text(outer, "cpuset.cpus", text) != 0 ||
        (!v2 && write_text(outer, "cpuset.mems", "0\n") != 0))
        return "cannot configure the test's cpuset";
    if (v2) {
        /* As Slurm's step enables cpuset for its user/task_N children, which leave it empty. */
        snprintf(inner, sizeof inner, "%s/inner", outer);
        if (write_text(outer, "cgroup.subtree_control", "+cpuset") != 0 || mkdir(inner, 0755) != 0)
            return "cannot create a child cgroup with the cpuset controller";
    }
    if (move_self(v2 ? inner : outer) != 0) return "cannot join the test's cpuset";
    return NULL;
}

static void teardown(void) {
    move_self(home);
    if (*inner) rmdir(inner);
    rmdir(outer);
}

/* The set read and the file it came from, as the plugin reads a task's step. */
static void read_cpuset(unsigned levels_up, zb_cpuset_t *set, char *source, size_t len) {
    zb_status status = zb_cgroup_cpuset(NULL, 0, levels_up, set, source, len);
    if (status != ZB_OK) fail_msg("zb_cgroup_cpuset: %s", zb_last_error());
}

static void confining_level_is_read(void **state) {
    (void)state;
    zb_cpuset_t *set = zb_cpuset_alloc();
    char source[2048], want[1300];
    read_cpuset(0, set, source, sizeof source);
    /* v2: inner configures nothing, so outer's effective set confines the process. */
    snprintf(want, sizeof want, "%s/%s", outer,
             v2 ? "cpuset.cpus.effective" : "cpuset.effective_cpus");
    assert_string_equal(source, want);
    assert_int_equal(zb_cpuset_weight(set), 1);
    assert_true(zb_cpuset_isset(set, (unsigned)cpu));
    zb_cpuset_free(set);
}

static void levels_up_reads_above_the_test_cgroup(void **state) {
    (void)state;
    if (other_cpu < 0) skip();
    zb_cpuset_t *set = zb_cpuset_alloc();
    char source[2048];
    /* v2: one level up from inner is still outer; two is outer's parent, with both CPUs. */
    read_cpuset(v2 ? 2 : 1, set, source, sizeof source);
    assert_null(strstr(source, "zb-cpuset-"));
    assert_true(zb_cpuset_isset(set, (unsigned)cpu));
    assert_true(zb_cpuset_isset(set, (unsigned)other_cpu));
    zb_cpuset_free(set);
}

static void allowed_cpus_follow_the_cgroup(void **state) {
    (void)state;
    zb_cpuset_t *set = zb_cpuset_alloc();
    char source[2048];
    assert_int_equal(zb_allowed_cpus(NULL, 0, set, source, sizeof source), ZB_OK);
    assert_int_equal(zb_cpuset_weight(set), 1);
    assert_true(zb_cpuset_isset(set, (unsigned)cpu));
    assert_non_null(strstr(source, outer));
    zb_cpuset_free(set);
}

int main(void) {
    if (geteuid() != 0) return zb_test_skip("needs root to create a cpuset cgroup");
    const char *why = setup();
    if (why) {
        teardown();
        return zb_test_skip(why);
    }
    printf("cgroup %s, cpuset %s, CPU %d\n", v2 ? "v2" : "v1", outer, cpu);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(confining_level_is_read),
        cmocka_unit_test(levels_up_reads_above_the_test_cgroup),
        cmocka_unit_test(allowed_cpus_follow_the_cgroup),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    teardown();
    return failed;
}
