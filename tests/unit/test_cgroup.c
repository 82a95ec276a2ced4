/* zb_cgroup_cpuset / zb_allowed_cpus on fake /proc + cgroup trees built under a temporary root
 * (v1, v2, hybrid, sub-tree mounts, empty and missing levels), and once on this machine. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

#define ZB_FAKE_TREE_NAME "zb_cgroup"
#include "fake_tree.h"

/* Writes `content` to root/dir/file. */
static void put_in(const char *dir, const char *file, const char *content) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    put(path, content);
}

/* A cgroup v2 directory that configures `cpus`: its cpuset.cpus and the effective set. */
static void v2_configured(const char *dir, const char *cpus) {
    put_in(dir, "cpuset.cpus", cpus);
    put_in(dir, "cpuset.cpus.effective", cpus);
}

/* zb_cgroup_cpuset on the fake root, which must succeed with `list` read from root/`file`. */
static void expect_cpuset(pid_t pid, unsigned levels_up, const char *list, const char *file) {
    zb_cpuset_t *set = zb_cpuset_alloc();
    char source[1024], text[256], want[1024];
    zb_status st = zb_cgroup_cpuset(root, pid, levels_up, set, source, sizeof source);
    if (st != ZB_OK)
        fail_msg("levels_up=%u: %s: %s", levels_up, zb_status_name(st), zb_last_error());
    zb_cpulist_format(set, text, sizeof text);
    assert_string_equal(text, list);
    snprintf(want, sizeof want, "%s/%s", root, file);
    assert_string_equal(source, want);
    zb_cpuset_free(set);
}

/* zb_cgroup_cpuset on the fake root, which must fail with `status`; returns the message. */
static const char *expect_failure(pid_t pid, unsigned levels_up, zb_status status) {
    zb_cpuset_t *set = zb_cpuset_alloc();
    assert_int_equal(zb_cpulist_parse("99", set), ZB_OK);
    char source[64] = "untouched";
    zb_status st = zb_cgroup_cpuset(root, pid, levels_up, set, source, sizeof source);
    if (st != status)
        fail_msg("expected %s, got %s (%s)", zb_status_name(status), zb_status_name(st),
                 zb_last_error());
    assert_true(zb_cpuset_isset(set, 99) && zb_cpuset_weight(set) == 1);
    assert_string_equal(source, "untouched");
    zb_cpuset_free(set);
    return zb_last_error();
}

/* A new set of the CPUs this process may run on. */
static zb_cpuset_t *affinity_of_self(void) {
    cpu_set_t *mask = CPU_ALLOC(65536);
    size_t size = CPU_ALLOC_SIZE(65536);
    assert_int_equal(sched_getaffinity(0, size, mask), 0);
    zb_cpuset_t *out = zb_cpuset_alloc();
    for (unsigned cpu = 0; cpu < 65536; ++cpu)
        if (CPU_ISSET_S(cpu, size, mask)) hwloc_bitmap_set(zb_cpuset_hwloc(out), cpu);
    CPU_FREE(mask);
    return out;
}

/* A hybrid host like this one: v1 hierarchies (cpuset among them) plus a v2 mount without
 * cpuset, and a Slurm task/cgroup v1 layout. */
static const char *hybrid_mountinfo =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,nosuid shared:12 - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:13 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid shared:8 - cgroup2 cgroup2 rw,nsdelegate\n";

static void slurm_v1_tree(void) {
    put("proc/self/cgroup", "5:memory:/slurm/uid_1000/job_42/step_0/task_1\n"
                            "3:cpuset:/slurm/uid_1000/job_42/step_0/task_1\n"
                            "2:cpu,cpuacct:/slurm/uid_1000/job_42/step_0/task_1\n"
                            "0::/user.slice\n");
    put("proc/self/mountinfo", hybrid_mountinfo);
    put("sys/fs/cgroup/unified/cgroup.controllers", "\n");
    put("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-63\n");
    put("sys/fs/cgroup/cpuset/cpuset.cpus", "0-63\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/cpuset.effective_cpus", "0-47\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/step_0/cpuset.effective_cpus",
        "0,4-11,21-26,30-46\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/step_0/task_1/cpuset.effective_cpus", "4-11\n");
    /* a decoy: the memory hierarchy has the same path and must not be read */
    put("sys/fs/cgroup/memory/slurm/uid_1000/job_42/step_0/task_1/cpuset.effective_cpus", "1\n");
}

#define TASK1 "sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/step_0/task_1/"
#define STEP0 "sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/step_0/"

static void test_v1_slurm_levels(void **state) {
    (void)state;
    slurm_v1_tree();
    expect_cpuset(0, 0, "4-11", TASK1 "cpuset.effective_cpus");
    expect_cpuset(0, 1, "0,4-11,21-26,30-46", STEP0 "cpuset.effective_cpus");
    expect_cpuset(0, 2, "0-47", "sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/cpuset.effective_cpus");
    /* uid_1000 and slurm have no file: their ancestor decides */
    expect_cpuset(0, 3, "0-63", "sys/fs/cgroup/cpuset/cpuset.effective_cpus");
    expect_cpuset(0, 5, "0-63", "sys/fs/cgroup/cpuset/cpuset.effective_cpus");
    const char *msg = expect_failure(0, 6, ZB_EINVAL);
    assert_non_null(strstr(msg, "levels_up=6 climbs above the cgroup mount "));
    assert_non_null(strstr(msg, "(the cgroup is 5 level(s) below it)"));
}

static void test_v1_fallback_and_empty_levels(void **state) {
    (void)state;
    slurm_v1_tree();
    /* an older kernel without effective_cpus: cpuset.cpus is read */
    put(TASK1 "cpuset.cpus", "6-7\n");
    char path[1024];
    snprintf(path, sizeof path, "%s/" TASK1 "cpuset.effective_cpus", root);
    assert_int_equal(unlink(path), 0);
    expect_cpuset(0, 0, "6-7", TASK1 "cpuset.cpus");
    /* an empty level defers to its parent */
    put(TASK1 "cpuset.cpus", "\n");
    expect_cpuset(0, 0, "0,4-11,21-26,30-46", STEP0 "cpuset.effective_cpus");
    put(TASK1 "cpuset.effective_cpus", "");
    put(STEP0 "cpuset.effective_cpus", "\n");
    /* an empty effective set is not overridden by the same level's configured one (the kernel
     * would not run tasks there): the parent decides */
    put(STEP0 "cpuset.cpus", "8-9\n");
    expect_cpuset(0, 0, "0-47", "sys/fs/cgroup/cpuset/slurm/uid_1000/job_42/cpuset.effective_cpus");
}

static void test_v1_noprefix(void **state) {
    (void)state;
    put("proc/self/cgroup", "1:cpuset:/job\n");
    put("proc/self/mountinfo", "30 1 0:40 / /dev/cpuset rw - cgroup none rw,noprefix,cpuset\n");
    put("dev/cpuset/job/cpuset.effective_cpus", "0\n"); /* not the noprefix name */
    put("dev/cpuset/job/effective_cpus", "2-5\n");
    expect_cpuset(0, 0, "2-5", "dev/cpuset/job/effective_cpus");
}

static void slurm_v2_tree(const char *controllers) {
    put("proc/self/cgroup", "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n");
    put("proc/self/mountinfo",
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw,nsdelegate\n");
    put("sys/fs/cgroup/cgroup.controllers", controllers);
    put("sys/fs/cgroup/cpuset.cpus.effective", "0-63\n");
    /* task/cgroup with ConstrainCores=yes writes cpuset.cpus at the job and the step */
    put("sys/fs/cgroup/system.slice/cpuset.cpus", "");
    put("sys/fs/cgroup/system.slice/cpuset.cpus.effective", "0-63\n");
    v2_configured("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42", "0-31\n");
    v2_configured("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0", "0-15,32-47\n");
    /* user/ configures nothing; cpuset is not enabled in task_0/, which has no cpuset files */
    put("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/cpuset.cpus", "\n");
    put("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/cpuset.cpus.effective",
        "0-15,32-47\n");
    put("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/task_0/cgroup.procs", "");
}

#define V2STEP "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/"

static void test_v2(void **state) {
    (void)state;
    slurm_v2_tree("cpuset cpu io memory hugetlb pids rdma misc\n");
    expect_cpuset(0, 0, "0-15,32-47", V2STEP "cpuset.cpus.effective");
    expect_cpuset(0, 2, "0-15,32-47", V2STEP "cpuset.cpus.effective");
    expect_cpuset(0, 3, "0-31",
                  "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/cpuset.cpus.effective");
    expect_cpuset(0, 5, "0-63", "sys/fs/cgroup/cpuset.cpus.effective");
    expect_cpuset(0, 6, "0-63", "sys/fs/cgroup/cpuset.cpus.effective");
    expect_failure(0, 7, ZB_EINVAL);
    /* the configured level without its effective file */
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, V2STEP "cpuset.cpus.effective");
    assert_int_equal(unlink(path), 0);
    const char *msg = expect_failure(0, 0, ZB_ESYS);
    assert_non_null(strstr(msg, "no non-empty cpuset.cpus.effective in "));
    assert_non_null(strstr(msg, "/step_0, the cgroup that confines "));
}

/* Slurm on cgroup v2 enables the cpuset controller for every job and step, but writes their
 * cpuset.cpus only under task/cgroup with ConstrainCores=yes. Without it every level's effective
 * set is the whole node's: the source must then be the mount's root, never the step, so that the
 * plugin does not take the node for the step's CPUs. */
static void test_v2_step_not_constrained(void **state) {
    (void)state;
    slurm_v2_tree("cpuset cpu io memory pids\n");
    put("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/cpuset.cpus", "");
    put("sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/cpuset.cpus.effective", "0-63\n");
    put(V2STEP "cpuset.cpus", "\n");
    put(V2STEP "cpuset.cpus.effective", "0-63\n");
    put(V2STEP "user/cpuset.cpus.effective", "0-63\n");
    expect_cpuset(0, 0, "0-63", "sys/fs/cgroup/cpuset.cpus.effective");
    /* an admin's AllowedCPUs= on system.slice confines it there, still not at the step */
    v2_configured("sys/fs/cgroup/system.slice", "2-61\n");
    expect_cpuset(0, 0, "2-61", "sys/fs/cgroup/system.slice/cpuset.cpus.effective");
}

static void test_v2_without_cpuset(void **state) {
    (void)state;
    slurm_v2_tree("cpu io memory pids\n");
    char want[1024];
    snprintf(want, sizeof want,
             "no cpuset controller for this process: cpuset is not enabled in "
             "%s/sys/fs/cgroup/cgroup.controllers",
             root);
    assert_string_equal(expect_failure(0, 0, ZB_ENOENT), want);
    /* zb_allowed_cpus falls back to the affinity alone */
    zb_cpuset_t *set = zb_cpuset_alloc(), *aff = affinity_of_self();
    char source[64];
    assert_int_equal(zb_allowed_cpus(root, 0, set, source, sizeof source), ZB_OK);
    assert_true(zb_cpuset_isequal(set, aff));
    assert_string_equal(source, "sched_getaffinity");
    zb_cpuset_free(set);
    zb_cpuset_free(aff);
}

static void test_hybrid_v1_wins(void **state) {
    (void)state;
    slurm_v1_tree();
    /* even if the v2 mount claims cpuset, the v1 cpuset hierarchy is the one read */
    put("sys/fs/cgroup/unified/cgroup.controllers", "cpuset cpu\n");
    put("sys/fs/cgroup/unified/user.slice/cpuset.cpus.effective", "1\n");
    expect_cpuset(0, 0, "4-11", TASK1 "cpuset.effective_cpus");
}

static void test_hybrid_v2_cpuset(void **state) {
    (void)state;
    /* cpuset is not bound to any v1 hierarchy, and is enabled on the v2 one */
    put("proc/self/cgroup", "5:memory:/a\n2:cpu,cpuacct:/a\n0::/job/step\n");
    put("proc/self/mountinfo", hybrid_mountinfo);
    put("sys/fs/cgroup/unified/cgroup.controllers", "cpuset\n");
    v2_configured("sys/fs/cgroup/unified/job/step", "3,5\n");
    put("sys/fs/cgroup/cpuset/job/step/cpuset.effective_cpus", "1\n");
    expect_cpuset(0, 0, "3,5", "sys/fs/cgroup/unified/job/step/cpuset.cpus.effective");
}

static void test_subtree_mount(void **state) {
    (void)state;
    /* a container sees only /slurm of the cpuset hierarchy, mounted at /sys/fs/cgroup/cpuset;
     * a mount of /slur elsewhere is not a prefix of /slurm/... component-wise */
    put("proc/self/cgroup", "3:cpuset:/slurm/uid_0/job_7/step_2\n");
    put("proc/self/mountinfo",
        "50 40 0:31 /slur /decoy rw - cgroup cgroup rw,cpuset\n"
        "51 40 0:31 /other /decoy2 rw - cgroup cgroup rw,cpuset\n"
        "52 40 0:31 /slurm /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n");
    put("decoy/m/uid_0/job_7/step_2/cpuset.effective_cpus", "1\n");
    put("decoy2/uid_0/job_7/step_2/cpuset.effective_cpus", "1\n");
    put("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-127\n");
    put("sys/fs/cgroup/cpuset/uid_0/job_7/step_2/cpuset.effective_cpus", "64,97-127\n");
    expect_cpuset(0, 0, "64,97-127",
                  "sys/fs/cgroup/cpuset/uid_0/job_7/step_2/cpuset.effective_cpus");
    expect_cpuset(0, 1, "0-127", "sys/fs/cgroup/cpuset/cpuset.effective_cpus");
    expect_cpuset(0, 3, "0-127", "sys/fs/cgroup/cpuset/cpuset.effective_cpus");
    /* the hierarchy above the exposed sub-tree cannot be reached */
    assert_non_null(strstr(expect_failure(0, 4, ZB_EINVAL), "(the cgroup is 3 level(s) below it)"));

    /* a cgroup outside every mounted sub-tree: no usable controller */
    put("proc/self/cgroup", "3:cpuset:/system/other\n");
    char want[1024];
    snprintf(want, sizeof want,
             "no cpuset controller for this process: its cgroup v1 cpuset cgroup /system/other is "
             "not under any cpuset mount in %s/proc/self/mountinfo",
             root);
    assert_string_equal(expect_failure(0, 0, ZB_ENOENT), want);
    /* a path outside the cgroup namespace */
    put("proc/self/cgroup", "3:cpuset:/../../slurm/x\n");
    expect_failure(0, 0, ZB_ENOENT);
}

static void test_escaped_mount_point(void **state) {
    (void)state;
    put("proc/self/cgroup", "0::/a\n");
    put("proc/self/mountinfo", "60 1 0:50 / /mnt/cg\\040v2\\134x rw - cgroup2 cgroup2 rw\n");
    put("mnt/cg v2\\x/cgroup.controllers", "cpu cpuset\n");
    v2_configured("mnt/cg v2\\x/a", "0-15,32-47\n");
    expect_cpuset(0, 0, "0-15,32-47", "mnt/cg v2\\x/a/cpuset.cpus.effective");
}

static void test_pid_and_fsroot(void **state) {
    (void)state;
    put("proc/4242/cgroup", "0::/j\n");
    put("proc/4242/mountinfo", "25 22 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/cgroup.controllers", "cpuset\n");
    v2_configured("sys/fs/cgroup/j", "7\n");
    expect_cpuset(4242, 0, "7", "sys/fs/cgroup/j/cpuset.cpus.effective");
    /* trailing slashes on fsroot change nothing */
    zb_cpuset_t *set = zb_cpuset_alloc();
    char with_slash[300], source[1024], want[1024];
    snprintf(with_slash, sizeof with_slash, "%s//", root);
    assert_int_equal(zb_cgroup_cpuset(with_slash, 4242, 0, set, source, sizeof source), ZB_OK);
    snprintf(want, sizeof want, "%s/sys/fs/cgroup/j/cpuset.cpus.effective", root);
    assert_string_equal(source, want);
    /* a short source buffer is truncated and terminated; NULL is allowed */
    char small[8];
    assert_int_equal(zb_cgroup_cpuset(root, 4242, 0, set, small, sizeof small), ZB_OK);
    assert_int_equal(strncmp(small, want, 7), 0);
    assert_int_equal(strlen(small), 7);
    assert_int_equal(zb_cgroup_cpuset(root, 4242, 0, set, NULL, 0), ZB_OK);
    zb_cpuset_free(set);
    /* no /proc/self in this root */
    const char *msg = expect_failure(0, 0, ZB_ESYS);
    assert_non_null(strstr(msg, "/proc/self/cgroup: No such file or directory"));
    assert_int_equal(zb_cgroup_cpuset(root, 4242, 0, NULL, NULL, 0), ZB_EINVAL);
    expect_failure(-5, 0, ZB_EINVAL);
}

static void test_no_controller_and_bad_content(void **state) {
    (void)state;
    put("proc/self/cgroup", "5:memory:/a\n");
    put("proc/self/mountinfo", hybrid_mountinfo);
    char want[1024];
    snprintf(want, sizeof want,
             "no cpuset controller for this process: %s/proc/self/cgroup lists neither a cpuset "
             "nor a cgroup v2 hierarchy",
             root);
    assert_string_equal(expect_failure(0, 0, ZB_ENOENT), want);

    put("proc/self/cgroup", "3:cpuset:/bad\n");
    put("sys/fs/cgroup/cpuset/bad/cpuset.effective_cpus", "0-3x\n");
    snprintf(want, sizeof want,
             "invalid cpu list in %s/sys/fs/cgroup/cpuset/bad/cpuset.effective_cpus '0-3x' at "
             "character 4: expected ',' or '-' after a CPU number, found 'x'",
             root);
    assert_string_equal(expect_failure(0, 0, ZB_EINVAL), want);
}

static void test_allowed_intersects_affinity(void **state) {
    (void)state;
    zb_cpuset_t *aff = affinity_of_self(), *set = zb_cpuset_alloc();
    /* the cgroup grants the first CPU we may run on and one we may not */
    char list[64], source[1024], want[1024];
    snprintf(list, sizeof list, "%d,65535\n", zb_cpuset_next(aff, -1));
    put("proc/self/cgroup", "3:cpuset:/\n");
    put("proc/self/mountinfo", hybrid_mountinfo);
    put("sys/fs/cgroup/cpuset/cpuset.effective_cpus", list);
    assert_int_equal(zb_allowed_cpus(root, 0, set, source, sizeof source), ZB_OK);
    assert_int_equal(zb_cpuset_weight(set), 1);
    assert_int_equal(zb_cpuset_next(set, -1), zb_cpuset_next(aff, -1));
    snprintf(want, sizeof want, "%s/sys/fs/cgroup/cpuset/cpuset.effective_cpus", root);
    assert_string_equal(source, want);
    zb_cpuset_free(aff);
    zb_cpuset_free(set);
}

static void test_live_machine(void **state) {
    (void)state;
    zb_cpuset_t *aff = affinity_of_self(), *set = zb_cpuset_alloc();
    char source[1024];
    assert_int_equal(zb_allowed_cpus(NULL, 0, set, source, sizeof source), ZB_OK);
    assert_true(zb_cpuset_isequal(set, aff));
    assert_int_equal(zb_allowed_cpus("", getpid(), set, NULL, 0), ZB_OK);
    assert_true(zb_cpuset_isequal(set, aff));
    zb_status st = zb_cgroup_cpuset(NULL, 0, 0, set, source, sizeof source);
    if (st == ZB_OK) {
        /* the kernel keeps the affinity inside the cpuset */
        assert_true(
            hwloc_bitmap_isincluded(zb_cpuset_hwloc_const(aff), zb_cpuset_hwloc_const(set)));
        assert_true(strstr(source, "/cpuset.effective_cpus") || strstr(source, "/cpuset.cpus") ||
                    strstr(source, "/effective_cpus"));
        print_message("this machine: cpuset from %s\n", source);
    } else {
        assert_int_equal(st, ZB_ENOENT);
        assert_non_null(strstr(zb_last_error(), "no cpuset controller"));
        print_message("this machine: %s\n", zb_last_error());
    }
    zb_cpuset_free(aff);
    zb_cpuset_free(set);
}

/* zb_cgroup_memory_headroom: the least of limit - working set over the levels with a limit. */
static void expect_headroom(uint64_t headroom, uint64_t limit, uint64_t in_use, const char *file) {
    uint64_t h = 0, l = 0, u = 0;
    char source[1024], want[1024];
    zb_status st = zb_cgroup_memory_headroom(root, 0, &h, &l, &u, source, sizeof source);
    if (st != ZB_OK) fail_msg("%s: %s", zb_status_name(st), zb_last_error());
    assert_int_equal(h, headroom);
    assert_int_equal(l, limit);
    assert_int_equal(u, in_use);
    snprintf(want, sizeof want, "%s/%s", root, file);
    assert_string_equal(source, want);
}

static void test_memory_v1(void **state) {
    (void)state;
    put("proc/self/mountinfo", "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
    put("proc/self/cgroup", "4:memory:/slurm/uid_0/job_7/step_0\n3:cpuset:/\n");
    const char *job = "sys/fs/cgroup/memory/slurm/uid_0/job_7",
               *step = "sys/fs/cgroup/memory/slurm/uid_0/job_7/step_0";
    /* unlimited everywhere: ENOENT */
    put_in(step, "memory.limit_in_bytes", "9223372036854771712\n");
    put_in(step, "memory.usage_in_bytes", "1000\n");
    uint64_t h = 0;
    assert_int_equal(zb_cgroup_memory_headroom(root, 0, &h, NULL, NULL, NULL, 0), ZB_ENOENT);
    assert_non_null(strstr(zb_last_error(), "no memory limit"));
    /* the job's limit binds: 2 GiB, 1.5 GiB used of which 0.5 GiB inactive file pages */
    put_in(job, "memory.limit_in_bytes", "2147483648\n");
    put_in(job, "memory.usage_in_bytes", "1610612736\n");
    put_in(job, "memory.stat", "cache 1\ninactive_file 7\ntotal_inactive_file 536870912\n");
    expect_headroom(1073741824, 2147483648, 1073741824,
                    "sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes");
    /* a tighter step limit below wins; working set above the limit leaves no room */
    put_in(step, "memory.limit_in_bytes", "500\n");
    expect_headroom(0, 500, 1000,
                    "sys/fs/cgroup/memory/slurm/uid_0/job_7/step_0/memory.limit_in_bytes");
}

static void test_memory_v2(void **state) {
    (void)state;
    put("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("proc/self/cgroup", "0::/system.slice/slurmstepd.scope/job_3/step_1/user/task_0\n");
    const char *job = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_3",
               *step = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_3/step_1";
    put_in(job, "memory.max", "1073741824\n");
    put_in(job, "memory.current", "73741824\n");
    put_in(job, "memory.stat", "anon 1\nfile 2\ninactive_file 0\n");
    put_in(step, "memory.max", "max\n");
    put_in(step, "memory.current", "12\n");
    expect_headroom(1000000000, 1073741824, 73741824,
                    "sys/fs/cgroup/system.slice/slurmstepd.scope/job_3/memory.max");
    /* garbage in a limit file is an error, not "unlimited" */
    put_in(job, "memory.max", "lots\n");
    uint64_t h = 0;
    assert_int_equal(zb_cgroup_memory_headroom(root, 0, &h, NULL, NULL, NULL, 0), ZB_ESYS);
    assert_non_null(strstr(zb_last_error(), "unexpected content"));
    assert_int_equal(zb_cgroup_memory_headroom(root, 0, NULL, NULL, NULL, NULL, 0), ZB_EINVAL);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, fake_tree_setup, fake_tree_teardown)
    const struct CMUnitTest tests[] = {
        T(test_v1_slurm_levels),
        T(test_v1_fallback_and_empty_levels),
        T(test_v1_noprefix),
        T(test_v2),
        T(test_v2_step_not_constrained),
        T(test_v2_without_cpuset),
        T(test_hybrid_v1_wins),
        T(test_hybrid_v2_cpuset),
        T(test_subtree_mount),
        T(test_escaped_mount_point),
        T(test_pid_and_fsroot),
        T(test_no_controller_and_bad_content),
        T(test_allowed_intersects_affinity),
        T(test_live_machine),
        T(test_memory_v1),
        T(test_memory_v2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
