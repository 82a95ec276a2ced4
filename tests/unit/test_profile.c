/* Tuning profiles: saturation rule, file round trip, strict parsing, and how a profile sets the
 * optimizer core count for the tasks sharing a node. */
#include <zenbind/zenbind.h>

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static const char *seed_machine = "pack:2 [numa] core:16 pu:2(indexes=core:pack)";

static char *write_temp(const char *text) {
    static char path[64];
    strcpy(path, "/tmp/zb-profile-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void saturation_is_fewest_cores_within_five_percent(void **state) {
    (void)state;
    zb_profile_t *p;
    const double node0[] = {10.0, 18.0, 23.5, 24.5, 24.6, 24.0}; /* 23.5 >= 0.95 * 24.6 */
    const double node1[] = {7.0, 7.2};
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 0, node0, 6), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 1, node1, 2), ZB_OK);
    assert_int_equal(zb_profile_saturation(p, 0), 3);
    assert_int_equal(zb_profile_saturation(p, 1), 1); /* 7.0 >= 6.84: one core saturates */
    assert_int_equal(zb_profile_saturation(p, 2), 0); /* unknown node */
    /* Either side of the 5% line: 18.9 is 94.5% of 20, 19.1 is 95.5% */
    const double node2[] = {10.0, 18.9, 19.1, 20.0};
    assert_int_equal(zb_profile_add_node(p, 2, node2, 4), ZB_OK);
    assert_int_equal(zb_profile_saturation(p, 2), 3);
    zb_profile_free(p);
}

static void save_then_load_round_trips(void **state) {
    (void)state;
    zb_profile_t *p, *q;
    const double g[] = {5.0, 9.5, 12.0, 12.1};
    char path[] = "/tmp/zb-profile-rt-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 3, g, 4), ZB_OK);
    assert_int_equal(zb_profile_save(p, path), ZB_OK);
    assert_int_equal(zb_profile_load(path, &q), ZB_OK);
    assert_int_equal(zb_profile_saturation(q, 3), zb_profile_saturation(p, 3));
    assert_int_equal(zb_profile_saturation(q, 3), 3);
    zb_profile_free(p);
    zb_profile_free(q);
    unlink(path);
}

/* zenbind(1): tune's output is "replaced atomically": a reader holding the old file keeps reading
 * it whole, the new one appears complete under the name, and no temporary file is left. */
static void save_replaces_the_file_atomically(void **state) {
    (void)state;
    char *path = write_temp("old profile\n");
    const int old = open(path, O_RDONLY);
    assert_true(old >= 0);
    zb_profile_t *p;
    const double g[] = {5.0, 9.5};
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 0, g, 2), ZB_OK);
    assert_int_equal(zb_profile_save(p, path), ZB_OK);
    char buf[64] = {0};
    assert_int_equal(pread(old, buf, sizeof buf - 1, 0), 12);
    assert_string_equal(buf, "old profile\n");
    struct stat was, is;
    assert_int_equal(fstat(old, &was), 0);
    assert_int_equal(stat(path, &is), 0);
    assert_true(was.st_ino != is.st_ino);
    close(old);
    char tmp[96];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    assert_int_equal(access(tmp, F_OK), -1);
    zb_profile_t *q;
    assert_int_equal(zb_profile_load(path, &q), ZB_OK);
    assert_int_equal(zb_profile_saturation(q, 0), 2);
    zb_profile_free(q);
    /* A save that cannot happen leaves the file as it was. */
    assert_int_equal(zb_profile_save(p, "/nonexistent-dir/x.profile"), ZB_ESYS);
    assert_non_null(strstr(zb_last_error(), "/nonexistent-dir/x.profile"));
    zb_profile_free(p);
    unlink(path);
}

static void bad_files_are_refused_with_the_line(void **state) {
    (void)state;
    /* Each bad file, the line its message names (0: the file only) and what the message says. */
    static const struct {
        const char *text;
        unsigned line;
        const char *why;
    } bad[] = {
        {"", 0, "is empty"},
        {"zenbind-profile 2\n", 1, "not a zenbind profile"},
        {"zenbind-profile 1\nnode 0 saturate 1\n", 2, "expected 'node N saturate S gbps"},
        {"zenbind-profile 1\nnode 0 saturate 3 gbps 1,2\n", 2,
         "saturate 3 is more than the 2 throughput figures given"},
        {"zenbind-profile 1\nnode 0 saturate 0 gbps 1\n", 2, "saturate must be at least 1"},
        {"zenbind-profile 1\nnode 0 saturate 1 gbps 1,-2\n", 2, "'-2' is not a throughput"},
        /* would save as 0.000 */
        {"zenbind-profile 1\nnode 0 saturate 1 gbps 0.0001\n", 2, "between 0.001 and 1000000"},
        {"zenbind-profile 1\nnode 0 saturate 1 gbps 2000000\n", 2, "between 0.001 and 1000000"},
        {"zenbind-profile 1\nnode x saturate 1 gbps 1\n", 2, "'x' is not a whole number"},
        {"zenbind-profile 1\nnode 0 saturate 1 gbps 1\nnode 0 saturate 1 gbps 1\n", 3,
         "node 0 appears twice"},
        {"zenbind-profile 1\nnode 0 saturate 1 gbps 1 extra\n", 2, "expected 'node N"},
        {"zenbind-profile 1\nnode 99999999 saturate 1 gbps 1\n", 2, "node 99999999 is more than"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        zb_profile_t *p = NULL;
        char *path = write_temp(bad[i].text);
        assert_int_equal(zb_profile_load(path, &p), ZB_EINVAL);
        char where[96];
        if (bad[i].line)
            snprintf(where, sizeof where, "%s:%u: ", path, bad[i].line);
        else
            snprintf(where, sizeof where, "%s ", path);
        if (!strstr(zb_last_error(), where) || !strstr(zb_last_error(), bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\" or \"%s\"", i, zb_last_error(), where,
                     bad[i].why);
        assert_null(p);
        unlink(path);
    }
    /* A long bad word is quoted in a bounded excerpt (found by the fuzz campaign: a 1108-byte
     * message), control bytes escaped. */
    char long_word[4096] = "zenbind-profile 1\nnode 0 saturate 1 gbps 1\nnode ";
    for (size_t i = strlen(long_word); i < 3000; i += 2)
        memcpy(long_word + i, "8,", 2);
    strcat(long_word, "\x01 saturate 1 gbps 1\n");
    char *long_path = write_temp(long_word);
    zb_profile_t *q = NULL;
    assert_int_equal(zb_profile_load(long_path, &q), ZB_EINVAL);
    assert_true(strlen(zb_last_error()) < strlen(long_path) + 200);
    assert_null(strchr(zb_last_error(), '\x01'));
    unlink(long_path);

    zb_profile_t *p = NULL;
    assert_int_equal(zb_profile_load("relative/path", &p), ZB_EINVAL);
    /* A FIFO (or a device) is refused at once: slurmstepd must not block opening it. */
    char fifo[] = "/tmp/zb_profile_fifo.XXXXXX";
    assert_non_null(mkdtemp(fifo));
    char fifo_path[64];
    snprintf(fifo_path, sizeof fifo_path, "%s/p", fifo);
    assert_int_equal(mkfifo(fifo_path, 0600), 0);
    assert_int_equal(zb_profile_load(fifo_path, &p), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "is not a regular file"));
    assert_null(p);
    unlink(fifo_path);
    rmdir(fifo);
    assert_int_equal(zb_profile_load("/dev/zero", &p), ZB_EINVAL);
    assert_int_equal(zb_profile_load("/nonexistent/zenbind.profile", &p), ZB_ESYS);
    assert_non_null(strstr(zb_last_error(), "/nonexistent/zenbind.profile"));
}

/* zb_profile_apply with the options `user` parsed, whose size is then `size`, on the two-socket
 * seed machine with a profile where node 0 saturates at 6 cores, node 1 at 4: its status, and
 * the options it leaves in *out. */
static zb_status apply(const char *allowed_list, unsigned ntasks, const char *user, size_t size,
                       zb_options *out) {
    zb_topology_t *topo;
    zb_profile_t *p;
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    const double node0[] = {4, 8, 12, 16, 20, 24, 24.2, 24.3};
    const double node1[] = {6, 12, 18, 24, 24.1, 24.2};
    assert_int_equal(zb_topology_load_synthetic(seed_machine, &topo), ZB_OK);
    assert_int_equal(zb_cpulist_parse(allowed_list, allowed), ZB_OK);
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 0, node0, 8), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 1, node1, 6), ZB_OK);
    zb_options_init(out);
    assert_int_equal(zb_options_parse(out, user, ZB_SCOPE_USER), ZB_OK);
    out->size = size;
    const zb_status st = zb_profile_apply(p, topo, allowed, ntasks, out);
    zb_profile_free(p);
    zb_topology_free(topo);
    zb_cpuset_free(allowed);
    return st;
}

static unsigned opt_after_apply(const char *allowed_list, unsigned ntasks, const char *user) {
    zb_options o;
    assert_int_equal(apply(allowed_list, ntasks, user, sizeof o, &o), ZB_OK);
    return o.opt_cores;
}

static void apply_shares_a_nodes_saturation_among_its_tasks(void **state) {
    (void)state;
    assert_int_equal(opt_after_apply("0-63", 2, ""), 6);      /* one task per node: max(6, 4) */
    assert_int_equal(opt_after_apply("0-63", 8, ""), 2);      /* 4 per node: ceil(6/4), ceil(4/4) */
    assert_int_equal(opt_after_apply("16-31", 2, ""), 2);     /* node 1 only, 2 tasks: ceil(4/2) */
    assert_int_equal(opt_after_apply("0-63", 64, ""), 1);     /* never below one core */
    assert_int_equal(opt_after_apply("0-63", 2, "opt=3"), 3); /* the user's opt= wins */
    assert_int_equal(opt_after_apply("0-63", 2, "train=5"), 0); /* train= fixes the split */
}

/* Memory-only NUMA nodes hold no tasks: on two Grace Hopper superchips (a DRAM node and the
 * GPU's HBM node over each Grace's CPUs) four tasks are two per Grace node, not one per node of
 * four (which gave each optimizer twice the cores that saturate its node). */
static void apply_counts_the_nodes_that_hold_tasks(void **state) {
    (void)state;
    zb_topology_t *topo;
    zb_profile_t *p;
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    const double gbps[] = {50, 100, 150, 200, 250, 300, 350, 400};
    assert_int_equal(
        zb_topology_load_xml(ZB_SOURCE_DIR "/tests/topologies/grace_hopper_2x.xml", &topo), ZB_OK);
    assert_int_equal(zb_cpulist_parse("0-143", allowed), ZB_OK);
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 0, gbps, 8), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 1, gbps, 8), ZB_OK);
    zb_options o;
    zb_options_init(&o);
    assert_int_equal(zb_profile_apply(p, topo, allowed, 4, &o), ZB_OK);
    assert_int_equal(o.opt_cores, 4); /* 8 cores saturate a node, shared by its 2 tasks */
    zb_profile_free(p);
    zb_topology_free(topo);
    zb_cpuset_free(allowed);
}

/* Options smaller than this release's zb_options are refused and left as they were. */
static void apply_refuses_short_options(void **state) {
    (void)state;
    zb_options o;
    assert_int_equal(apply("0-63", 2, "", sizeof o - 1, &o), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "zb_options_init"));
    assert_int_equal(o.opt_cores, 0);
    assert_int_equal(o.size, sizeof o - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(saturation_is_fewest_cores_within_five_percent),
        cmocka_unit_test(save_then_load_round_trips),
        cmocka_unit_test(apply_counts_the_nodes_that_hold_tasks),
        cmocka_unit_test(save_replaces_the_file_atomically),
        cmocka_unit_test(bad_files_are_refused_with_the_line),
        cmocka_unit_test(apply_shares_a_nodes_saturation_among_its_tasks),
        cmocka_unit_test(apply_refuses_short_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
