/* Tuning profiles: saturation rule, file round trip, strict parsing, and how a profile sets the
 * optimizer core count for the tasks sharing a node. */
#include <zenbind/zenbind.h>

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

static void bad_files_are_refused_with_the_line(void **state) {
    (void)state;
    static const char *bad[] = {
        "",                                                    /* empty */
        "zenbind-profile 2\n",                                 /* unknown version */
        "zenbind-profile 1\nnode 0 saturate 1\n",              /* missing gbps */
        "zenbind-profile 1\nnode 0 saturate 3 gbps 1,2\n",     /* saturate > counts */
        "zenbind-profile 1\nnode 0 saturate 0 gbps 1\n",       /* saturate 0 */
        "zenbind-profile 1\nnode 0 saturate 1 gbps 1,-2\n",    /* negative */
        "zenbind-profile 1\nnode 0 saturate 1 gbps 0.0001\n",  /* would save as 0.000 */
        "zenbind-profile 1\nnode 0 saturate 1 gbps 2000000\n", /* above 10^6 GB/s */
        "zenbind-profile 1\nnode x saturate 1 gbps 1\n",       /* node not a number */
        "zenbind-profile 1\nnode 0 saturate 1 gbps 1\nnode 0 saturate 1 gbps 1\n", /* twice */
        "zenbind-profile 1\nnode 0 saturate 1 gbps 1 extra\n",  /* trailing junk */
        "zenbind-profile 1\nnode 99999999 saturate 1 gbps 1\n", /* node out of range */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        zb_profile_t *p = NULL;
        char *path = write_temp(bad[i]);
        assert_int_equal(zb_profile_load(path, &p), ZB_EINVAL);
        assert_non_null(strstr(zb_last_error(), path)); /* names the file (and line) */
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

/* Node 0 saturates at 6 cores, node 1 at 4, on the two-socket seed machine. */
static unsigned opt_after_apply(const char *allowed_list, unsigned ntasks, const char *user) {
    zb_topology_t *topo;
    zb_profile_t *p;
    zb_options o;
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    const double node0[] = {4, 8, 12, 16, 20, 24, 24.2, 24.3};
    const double node1[] = {6, 12, 18, 24, 24.1, 24.2};
    assert_int_equal(zb_topology_load_synthetic(seed_machine, &topo), ZB_OK);
    assert_int_equal(zb_cpulist_parse(allowed_list, allowed), ZB_OK);
    assert_int_equal(zb_profile_create(&p), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 0, node0, 8), ZB_OK);
    assert_int_equal(zb_profile_add_node(p, 1, node1, 6), ZB_OK);
    zb_options_init(&o);
    assert_int_equal(zb_options_parse(&o, user, ZB_SCOPE_USER), ZB_OK);
    assert_int_equal(zb_profile_apply(p, topo, allowed, ntasks, &o), ZB_OK);
    zb_profile_free(p);
    zb_topology_free(topo);
    hwloc_bitmap_free(allowed);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(saturation_is_fewest_cores_within_five_percent),
        cmocka_unit_test(save_then_load_round_trips),
        cmocka_unit_test(bad_files_are_refused_with_the_line),
        cmocka_unit_test(apply_shares_a_nodes_saturation_among_its_tasks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
