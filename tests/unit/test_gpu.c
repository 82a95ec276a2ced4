/* zb_gpus_load / zb_gpus_find / zb_gpus_assign on fake /proc and /sys trees built under a
 * temporary root: a DGX A100-like node (8 NVIDIA GPUs on NPS4 nodes 3,3,1,1,7,7,5,5), a 2-socket
 * node with AMD GPUs on both sockets, a GPU whose node the firmware does not give, no GPUs, and
 * the admin's map file. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zenbind/zenbind.h>

#define ZB_FAKE_TREE_NAME "zb_gpu"
#include "fake_tree.h"

/* A PCI function in sysfs: class, vendor, numa_node ("" leaves the file out), local_cpulist. */
static void pci(const char *bus, const char *cls, const char *vendor, const char *node,
                const char *cpus) {
    char file[256];
    snprintf(file, sizeof file, "sys/bus/pci/devices/%s/class", bus);
    put(file, cls);
    snprintf(file, sizeof file, "sys/bus/pci/devices/%s/vendor", bus);
    put(file, vendor);
    if (*node) {
        snprintf(file, sizeof file, "sys/bus/pci/devices/%s/numa_node", bus);
        put(file, node);
    }
    if (cpus) {
        snprintf(file, sizeof file, "sys/bus/pci/devices/%s/local_cpulist", bus);
        put(file, cpus);
    }
}

/* The NVIDIA driver's entry for one GPU. */
static void nvidia(const char *bus, int minor) {
    char file[256], text[512];
    snprintf(file, sizeof file, "proc/driver/nvidia/gpus/%s/information", bus);
    snprintf(text, sizeof text,
             "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 42\nGPU UUID: \t GPU-0000\n"
             "Video BIOS: \t 92.00.45.00.05\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
             "DMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\n"
             "GPU Excluded:\t No\n",
             bus, minor);
    put(file, text);
}

static zb_gpus_t *load(const char *map) {
    zb_gpus_t *gpus = NULL;
    if (zb_gpus_load(root, map, &gpus) != ZB_OK) fail_msg("zb_gpus_load: %s", zb_last_error());
    return gpus;
}

static void expect_gpu(const zb_gpus_t *gpus, unsigned index, int node, const char *bus) {
    zb_gpu g;
    if (zb_gpus_find(gpus, index, &g) != ZB_OK) fail_msg("GPU %u: %s", index, zb_last_error());
    assert_int_equal(g.index, index);
    if (g.numa_node != node) fail_msg("GPU %u: node %d, expected %d", index, g.numa_node, node);
    assert_string_equal(g.bus_id, bus);
}

/* DGX A100 in NPS4: the driver's entries give the GPUs, sysfs the nodes. GPU i is the i-th in bus
 * order (as NVML, CUDA and Slurm's AutoDetect number them), whatever the device minors: here the
 * driver handed them out with GPUs 0 and 1 swapped. */
static void dgx_a100(void **state) {
    (void)state;
    static const char *bus[] = {"0000:0f:00.0", "0000:07:00.0", "0000:47:00.0", "0000:4e:00.0",
                                "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"};
    static const char *node[] = {"3\n", "3\n", "1\n", "1\n", "7\n", "7\n", "5\n", "5\n"};
    for (int i = 0; i < 8; ++i) {
        pci(bus[i], "0x030200\n", "0x10de\n", node[i], "48-63,176-191\n");
        nvidia(bus[i], i);
    }
    pci("0000:c1:00.0", "0x020000\n", "0x15b3\n", "4\n", NULL); /* a ConnectX NIC */
    pci("0000:03:00.0", "0x030000\n", "0x1a03\n", "0\n", NULL); /* the BMC's ASPEED VGA */
    zb_gpus_t *gpus = load(NULL);
    assert_int_equal(zb_gpus_count(gpus), 8);
    const int expected[] = {3, 3, 1, 1, 7, 7, 5, 5};
    static const char *in_bus_order[] = {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0",
                                         "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0",
                                         "0000:b7:00.0", "0000:bd:00.0"};
    for (unsigned i = 0; i < 8; ++i)
        expect_gpu(gpus, i, expected[i], in_bus_order[i]);
    zb_gpu g;
    assert_int_equal(zb_gpus_get(gpus, 0, &g), ZB_OK);
    char cpus[64];
    zb_cpulist_format(g.local_cpus, cpus, sizeof cpus);
    assert_string_equal(cpus, "48-63,176-191");
    assert_non_null(strstr(zb_gpus_source(gpus), "/proc/driver/nvidia/gpus"));
    assert_int_equal(zb_gpus_find(gpus, 8, &g), ZB_ENOENT);
    assert_int_equal(zb_gpus_get(gpus, 8, &g), ZB_EINVAL);
    zb_gpus_free(gpus);
}

/* Two sockets, AMD GPUs (display controller class 0x0380) on both, no NVIDIA driver: the index is
 * the position in bus order, which here runs socket 1 first; display functions of other vendors
 * are not GPUs. */
static void two_sockets(void **state) {
    (void)state;
    pci("0000:c1:00.0", "0x038000\n", "0x1002\n", "0\n", "0-15\n");
    pci("0000:41:00.0", "0x038000\n", "0x1002\n", "1\n", "16-31\n");
    pci("0000:21:00.0", "0x038000\n", "0x1002\n", "1\n", "16-31\n");
    pci("0000:e1:00.0", "0x038000\n", "0x1002\n", "0\n", "0-15\n");
    pci("0000:02:00.0", "0x030000\n", "0x102b\n", "0\n", NULL); /* Matrox BMC VGA */
    pci("0000:03:00.0", "0x010802\n", "0x144d\n", "0\n", NULL); /* an NVMe drive */
    zb_gpus_t *gpus = load(NULL);
    assert_int_equal(zb_gpus_count(gpus), 4);
    expect_gpu(gpus, 0, 1, "0000:21:00.0");
    expect_gpu(gpus, 1, 1, "0000:41:00.0");
    expect_gpu(gpus, 2, 0, "0000:c1:00.0");
    expect_gpu(gpus, 3, 0, "0000:e1:00.0");
    assert_non_null(strstr(zb_gpus_source(gpus), "/sys/bus/pci/devices"));
    zb_gpus_free(gpus);
}

/* Firmware that gives no node (-1, or no numa_node file): the GPU is there, its node unknown. A
 * GPU on a CPU-less node is reported with that node: the planner decides what to do with it. */
static void unknown_and_cpuless_nodes(void **state) {
    (void)state;
    pci("0000:01:00.0", "0x030200\n", "0x10de\n", "-1\n", "0-63\n");
    pci("0000:02:00.0", "0x030200\n", "0x10de\n", "", NULL);
    pci("0000:03:00.0", "0x030200\n", "0x10de\n", "6\n", "\n");
    zb_gpus_t *gpus = load(NULL);
    assert_int_equal(zb_gpus_count(gpus), 3);
    expect_gpu(gpus, 0, -1, "0000:01:00.0");
    expect_gpu(gpus, 1, -1, "0000:02:00.0");
    expect_gpu(gpus, 2, 6, "0000:03:00.0");
    zb_gpu g;
    assert_int_equal(zb_gpus_get(gpus, 2, &g), ZB_OK);
    assert_int_equal(zb_cpuset_weight(g.local_cpus), 0);
    zb_gpus_free(gpus);
}

/* No GPU at all: an empty tree, or display functions that are not GPUs. */
static void no_gpus(void **state) {
    (void)state;
    zb_gpus_t *gpus = (zb_gpus_t *)1;
    assert_int_equal(zb_gpus_load(root, NULL, &gpus), ZB_ENOENT);
    assert_null(gpus);
    pci("0000:03:00.0", "0x030000\n", "0x1a03\n", "0\n", NULL);
    assert_int_equal(zb_gpus_load(root, NULL, &gpus), ZB_ENOENT);
    assert_non_null(strstr(zb_last_error(), "no GPU"));
}

/* Hostile trees fail with a message instead of inventing a GPU. */
static void bad_trees(void **state) {
    (void)state;
    zb_gpus_t *gpus = NULL;
    pci("0000:01:00.0", "0x030200\n", "0x10de\n", "three\n", NULL);
    assert_int_equal(zb_gpus_load(root, NULL, &gpus), ZB_ESYS);
    assert_non_null(strstr(zb_last_error(), "numa_node"));
    assert_int_equal(zb_gpus_load(root, NULL, NULL), ZB_EINVAL);
}

/* Minors that run across the NUMA nodes against bus order (2,3 on node 0; 0,1 on node 1): the
 * index follows the bus, which is what SLURM_STEP_GPUS means (it followed the minor before, and
 * put a step's GPU 0 on the other socket). A GPU the driver excludes is not counted (NVML does
 * not count it). MIG instances: Slurm numbers the slices, and discovery refuses to guess. */
static void bus_order_exclusions_and_mig(void **state) {
    (void)state;
    static const char *bus[] = {"0000:07:00.0", "0000:0f:00.0", "0000:87:00.0", "0000:8f:00.0"};
    static const char *node[] = {"0\n", "0\n", "1\n", "1\n"};
    static const int minor[] = {2, 3, 0, 1};
    for (int i = 0; i < 4; ++i) {
        pci(bus[i], "0x030200\n", "0x10de\n", node[i], NULL);
        nvidia(bus[i], minor[i]);
    }
    zb_gpus_t *gpus = load(NULL);
    for (unsigned i = 0; i < 4; ++i)
        expect_gpu(gpus, i, i < 2 ? 0 : 1, bus[i]);
    zb_gpus_free(gpus);
    put("proc/driver/nvidia/gpus/0000:0f:00.0/information",
        "Bus Location: \t 0000:0f:00.0\nDevice Minor: \t 3\nGPU Excluded:\t Yes\n");
    gpus = load(NULL);
    assert_int_equal(zb_gpus_count(gpus), 3);
    expect_gpu(gpus, 1, 1, "0000:87:00.0");
    zb_gpus_free(gpus);
    put("proc/driver/nvidia/capabilities/mig/config", "DeviceFileMinor: 1\n");
    gpus = load(NULL); /* MIG mode available, no instance made: whole GPUs */
    assert_int_equal(zb_gpus_count(gpus), 3);
    zb_gpus_free(gpus);
    put("proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", "DeviceFileMinor: 12\n");
    gpus = NULL;
    assert_int_equal(zb_gpus_load(root, NULL, &gpus), ZB_ENOENT);
    assert_non_null(strstr(zb_last_error(), "MIG instances"));
    assert_null(gpus);
}

static char map_path[512];

static const char *map(const char *text) {
    snprintf(map_path, sizeof map_path, "%s/gpus.map", root);
    FILE *f = fopen(map_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return map_path;
}

/* The admin's map wins over discovery and may give nodes discovery cannot. */
static void map_file(void **state) {
    (void)state;
    pci("0000:01:00.0", "0x030200\n", "0x10de\n", "-1\n", NULL);
    zb_gpus_t *gpus = load(map("# DGX A100, NPS4\n"
                               "0 3 0000:07:00.0\n"
                               "1\t3\t0000:0F:00.0   # upper case is fine\n"
                               "\n"
                               "  3 1 00000000:8A:00.0\n"
                               "2 1 10000:e1:00.0\n"
                               "4 0\n")); /* the bus id may be left out */
    assert_int_equal(zb_gpus_count(gpus), 5);
    expect_gpu(gpus, 0, 3, "0000:07:00.0");
    expect_gpu(gpus, 1, 3, "0000:0f:00.0");
    expect_gpu(gpus, 2, 1, "10000:e1:00.0");    /* a VMD domain, as sysfs names it */
    expect_gpu(gpus, 3, 1, "00000000:8a:00.0"); /* as nvidia-smi writes it */
    expect_gpu(gpus, 4, 0, "");
    zb_gpu g;
    assert_int_equal(zb_gpus_get(gpus, 2, &g), ZB_OK);
    assert_int_equal(g.index, 2); /* index order, not line order */
    assert_string_equal(zb_gpus_source(gpus), map_path);
    zb_gpus_free(gpus);
}

static void map_rejected(const char *text, const char *message) {
    zb_gpus_t *gpus = NULL;
    assert_int_equal(zb_gpus_load(root, map(text), &gpus), ZB_EINVAL);
    assert_null(gpus);
    if (!strstr(zb_last_error(), message))
        fail_msg("map '%s': message '%s' lacks '%s'", text, zb_last_error(), message);
}

static void map_errors(void **state) {
    (void)state;
    map_rejected("0 3\n0 1\n", "line 2: GPU 0 is listed twice");
    map_rejected("0\n", "line 1: GPU 0 has no NUMA node");
    map_rejected("0 x\n", "line 1: bad NUMA node 'x'");
    map_rejected("-1 0\n", "line 1: bad GPU index '-1'");
    map_rejected("1024 0\n", "bad GPU index '1024'");
    map_rejected("0 65536\n", "bad NUMA node '65536'");
    map_rejected("# ok\n0 1 0000:07:00\n", "line 2: bad PCI bus id");
    map_rejected("0 1 000:07:00.0\n", "bad PCI bus id");       /* a domain of 3 digits */
    map_rejected("0 1 000000000:07:00.0\n", "bad PCI bus id"); /* and of 9 */
    map_rejected("0 1 0000:07:00.0 extra\n", "expected 'INDEX NODE [BUS-ID]'");
    map_rejected("0 1\r\n", "control character");
    map_rejected("+1 0\n", "bad GPU index");
    zb_gpus_t *gpus = NULL;
    assert_int_equal(zb_gpus_load(root, map("# nothing\n\n"), &gpus), ZB_ENOENT);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such.map", root);
    assert_int_equal(zb_gpus_load(root, missing, &gpus), ZB_ESYS);
}

static void expect_assign(const char *list, unsigned ntasks, const unsigned *expected) {
    unsigned got[16];
    memset(got, 0xff, sizeof got);
    if (zb_gpus_assign(list, ntasks, got) != ZB_OK)
        fail_msg("assign '%s' to %u: %s", list, ntasks, zb_last_error());
    for (unsigned i = 0; i < ntasks; ++i)
        if (got[i] != expected[i])
            fail_msg("'%s', %u tasks: task %u got GPU %u, expected %u", list, ntasks, i, got[i],
                     expected[i]);
    assert_int_equal(got[ntasks], 0xffffffffu); /* nothing written past ntasks */
}

/* One GPU per rank; Slurm's --gpus-per-task=2 split; ranks sharing GPUs. */
static void assign(void **state) {
    (void)state;
    expect_assign("0,1,2,3,4,5,6,7", 8, (const unsigned[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect_assign("4,5,6,7", 2, (const unsigned[]){4, 6});
    expect_assign("1,3,5", 2, (const unsigned[]){1, 3});
    expect_assign("2,6", 4, (const unsigned[]){2, 2, 6, 6});
    expect_assign("3", 3, (const unsigned[]){3, 3, 3});
    unsigned out[4];
    const char *bad[] = {"", "0,", ",0", "0,,1", "a", "0-3", "1024", " 1", "GPU-8a1b", "-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        if (zb_gpus_assign(bad[i], 2, out) != ZB_EINVAL) fail_msg("'%s' accepted", bad[i]);
        assert_non_null(strstr(zb_last_error(), "bad GPU list"));
    }
    assert_int_equal(zb_gpus_assign("0", 0, out), ZB_EINVAL);
    assert_int_equal(zb_gpus_assign(NULL, 1, out), ZB_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(dgx_a100, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test_setup_teardown(two_sockets, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test_setup_teardown(unknown_and_cpuless_nodes, fake_tree_setup,
                                        fake_tree_teardown),
        cmocka_unit_test_setup_teardown(no_gpus, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test_setup_teardown(bad_trees, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test_setup_teardown(bus_order_exclusions_and_mig, fake_tree_setup,
                                        fake_tree_teardown),
        cmocka_unit_test_setup_teardown(map_file, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test_setup_teardown(map_errors, fake_tree_setup, fake_tree_teardown),
        cmocka_unit_test(assign),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
