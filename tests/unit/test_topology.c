/* Topology loading: synthetic strings, XML files, the live machine, and clear errors. */
#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static const char *seed = "pack:2 [numa] core:16 pu:2(indexes=core:pack)";

static void synthetic_seed_machine(void **state) {
    (void)state;
    zb_topology_t *t;
    char buf[128];
    assert_int_equal(zb_topology_load_synthetic(seed, &t), ZB_OK);
    zb_cpulist_format(zb_topology_cpuset(t), buf, sizeof buf);
    assert_string_equal(buf, "0-63");
    hwloc_topology_t h = zb_topology_hwloc(t);
    hwloc_obj_t node0 = hwloc_get_obj_by_type(h, HWLOC_OBJ_NUMANODE, 0);
    zb_cpulist_format(zb_cpuset_from_hwloc_const(node0->cpuset), buf, sizeof buf);
    assert_string_equal(buf, "0-15,32-47"); /* siblings numbered +32, as on the seed box */
    assert_int_equal(hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_CORE), 32);
    zb_topology_free(t);
}

static void xml_round_trip(void **state) {
    (void)state;
    zb_topology_t *a, *b;
    char path[] = "/tmp/zb-topology-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(zb_topology_load_synthetic(seed, &a), ZB_OK);
    assert_int_equal(hwloc_topology_export_xml(zb_topology_hwloc(a), path, 0), 0);
    assert_int_equal(zb_topology_load_xml(path, &b), ZB_OK);
    assert_true(zb_cpuset_isequal(zb_topology_cpuset(a), zb_topology_cpuset(b)));
    assert_int_equal(hwloc_get_nbobjs_by_type(zb_topology_hwloc(b), HWLOC_OBJ_NUMANODE), 2);
    zb_topology_free(a);
    zb_topology_free(b);
    unlink(path);
}

static void live_machine_includes_every_allowed_cpu(void **state) {
    (void)state;
    zb_topology_t *t;
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    assert_int_equal(zb_topology_load(&t), ZB_OK);
    assert_int_equal(zb_allowed_cpus(NULL, 0, allowed, NULL, 0), ZB_OK);
    assert_true(hwloc_bitmap_isincluded(zb_cpuset_hwloc_const(allowed),
                                        zb_cpuset_hwloc_const(zb_topology_cpuset(t))));
    zb_cpuset_free(allowed);
    zb_topology_free(t);
}

static void errors_name_the_source(void **state) {
    (void)state;
    zb_topology_t *t = NULL;
    assert_int_equal(zb_topology_load_xml("/nonexistent/topo.xml", &t), ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), "/nonexistent/topo.xml"));
    assert_non_null(strstr(zb_last_error(), strerror(ENOENT))); // and why it cannot be read
    assert_int_equal(zb_topology_load_xml("/", &t), ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), strerror(EISDIR)));
    assert_int_equal(zb_topology_load_synthetic("frobnicate:3", &t), ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), "frobnicate:3"));
    // More PUs than Linux runs on: refused before hwloc spends minutes building it.
    assert_int_equal(zb_topology_load_synthetic("pack:4 [numa] core:8192(x=a:b) pu:2", &t),
                     ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), "more than 8192 PUs"));
    assert_int_equal(zb_topology_load_synthetic("pack:99999999999999999999999 pu:2", &t),
                     ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), "more than 8192 PUs"));
    /* bare counts, and counts as hwloc reads them: hexadecimal, octal */
    static const char *const huge[] = {"64 64 64", "0x20 0x20 0x20", "pack:0X40 core:0x40 pu:4",
                                       "020000 2"};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; ++i) {
        assert_int_equal(zb_topology_load_synthetic(huge[i], &t), ZB_ETOPOLOGY);
        assert_non_null(strstr(zb_last_error(), "more than 8192 PUs"));
    }
    assert_int_equal(zb_topology_load_synthetic("core:8193", &t), ZB_ETOPOLOGY);
    assert_non_null(strstr(zb_last_error(), "more than 8192 PUs"));
    assert_int_equal(zb_topology_load_synthetic("pack:2 [numa(memory=9)] core:4 pu:2", &t), ZB_OK);
    assert_int_equal(hwloc_get_nbobjs_by_type(zb_topology_hwloc(t), HWLOC_OBJ_PU), 16);
    zb_topology_free(t);
    t = NULL;
    assert_int_equal(zb_topology_load_synthetic("2 2 2", &t), ZB_OK);
    assert_int_equal(hwloc_get_nbobjs_by_type(zb_topology_hwloc(t), HWLOC_OBJ_PU), 8);
    zb_topology_free(t);
    t = NULL;
    assert_int_equal(zb_topology_load_synthetic("010 0x2", &t), ZB_OK); /* 8 x 2, as hwloc reads */
    assert_int_equal(hwloc_get_nbobjs_by_type(zb_topology_hwloc(t), HWLOC_OBJ_PU), 16);
    zb_topology_free(t);
    t = NULL;
    assert_int_equal(zb_topology_load_synthetic("", &t), ZB_EINVAL);
    assert_int_equal(zb_topology_load_synthetic(seed, NULL), ZB_EINVAL);
    assert_null(t);
    assert_null(zb_topology_hwloc(NULL));
    zb_topology_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synthetic_seed_machine),
        cmocka_unit_test(xml_round_trip),
        cmocka_unit_test(live_machine_includes_every_allowed_cpu),
        cmocka_unit_test(errors_name_the_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
