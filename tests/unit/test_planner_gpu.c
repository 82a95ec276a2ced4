/* zb_plan_compute with gpu_nodes: each task's share dealt by its GPU's NUMA node. The shares
 * themselves must be those of a plan without GPUs (same CPUs, only their order among the tasks
 * changes), so every case also checks that. Topologies are hwloc synthetic: a DGX A100-like node
 * (two sockets in NPS4 mode, eight NUMA nodes), a two-socket node, a step that owns only part of a
 * node, and firmware distances that disagree with the tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

/* Two packages of four NUMA nodes (one per L3), 4 cores each: nodes 0-3 on package 0. */
#define DGX "pack:2 l3:4 [numa] core:4 pu:1"
#define TWO_SOCKETS "pack:2 [numa] core:8 pu:1"

static zb_topology_t *topology(const char *synthetic) {
    zb_topology_t *t = NULL;
    if (zb_topology_load_synthetic(synthetic, &t) != ZB_OK)
        fail_msg("topology '%s': %s", synthetic, zb_last_error());
    return t;
}

static zb_plan_t *plan(const zb_topology_t *t, const char *cpus, unsigned ntasks,
                       const char *options, const int *gpu_nodes) {
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    if (cpus) assert_int_equal(zb_cpulist_parse(cpus, allowed), ZB_OK);
    zb_options o;
    zb_options_init(&o);
    assert_int_equal(zb_options_parse(&o, options, ZB_SCOPE_USER), ZB_OK);
    zb_plan_t *p = NULL;
    if (zb_plan_compute(t, cpus ? allowed : zb_topology_cpuset(t), ntasks, &o, gpu_nodes, 0, &p) !=
        ZB_OK)
        fail_msg("plan: %s", zb_last_error());
    zb_cpuset_free(allowed);
    return p;
}

static zb_task_plan task(const zb_plan_t *p, unsigned i) {
    zb_task_plan t;
    assert_int_equal(zb_plan_task(p, i, &t), ZB_OK);
    return t;
}

/* The NUMA node(s) of task i's CPUs, as a list. */
static const char *nodes(const zb_plan_t *p, unsigned i) {
    static char buf[8][64];
    static int next;
    char *out = buf[next++ % 8];
    zb_cpulist_format(task(p, i).nodes, out, 64);
    return out;
}

/* Every share of `a` is a share of `b` (same training, optimizer CPUs), and the reverse. */
static void assert_same_shares(const zb_plan_t *a, const zb_plan_t *b) {
    const unsigned n = zb_plan_ntasks(a);
    assert_int_equal(zb_plan_ntasks(b), n);
    for (unsigned i = 0; i < n; ++i) {
        int found = 0;
        for (unsigned j = 0; j < n && !found; ++j)
            found = zb_cpuset_isequal(task(a, i).train_cpus, task(b, j).train_cpus) &&
                    zb_cpuset_isequal(task(a, i).opt_cpus, task(b, j).opt_cpus) &&
                    task(a, i).train_threads == task(b, j).train_threads;
        if (!found) fail_msg("task %u's share is not one of the plan without GPUs", i);
    }
}

/* The plan with `gpu_nodes`, checked to deal the shares of the plan without GPUs. */
static zb_plan_t *plan_same_shares(const zb_topology_t *t, const char *cpus, unsigned ntasks,
                                   const int *gpu_nodes) {
    zb_plan_t *p = plan(t, cpus, ntasks, "", gpu_nodes);
    zb_plan_t *plain = plan(t, cpus, ntasks, "", NULL);
    assert_same_shares(p, plain);
    zb_plan_free(plain);
    return p;
}

/* Warning text that names `task` and contains `text`. */
static int warned(const zb_plan_t *p, const char *who, const char *text) {
    for (unsigned i = 0; i < zb_plan_nwarnings(p); ++i) {
        const char *w = zb_plan_warning(p, i);
        if (strncmp(w, who, strlen(who)) == 0 && strstr(w, text)) return 1;
    }
    return 0;
}

static void assert_warned(const zb_plan_t *p, const char *who, const char *text) {
    if (warned(p, who, text)) return;
    for (unsigned i = 0; i < zb_plan_nwarnings(p); ++i)
        fprintf(stderr, "  warning: %s\n", zb_plan_warning(p, i));
    fail_msg("no warning '%s...%s'", who, text);
}

/* DGX A100: GPUs 0-7 on nodes 3,3,1,1,7,7,5,5, one rank per GPU. The first rank of each pair gets
 * its GPU's node; the second the nearest node left, on the same package. */
static void dgx_one_rank_per_gpu(void **state) {
    (void)state;
    zb_topology_t *t = topology(DGX);
    const int gpu[] = {3, 3, 1, 1, 7, 7, 5, 5};
    zb_plan_t *p = plan_same_shares(t, NULL, 8, gpu);
    zb_plan_t *plain = plan(t, NULL, 8, "", NULL);
    assert_string_equal(nodes(p, 0), "3");
    assert_string_equal(nodes(p, 2), "1");
    assert_string_equal(nodes(p, 4), "7");
    assert_string_equal(nodes(p, 6), "5");
    for (unsigned i = 1; i < 8; i += 2) {
        const int node = atoi(nodes(p, i));
        if (node / 4 != gpu[i] / 4 || node == gpu[i])
            fail_msg("task %u: node %d, not a free node of its GPU's package", i, node);
        char who[16];
        snprintf(who, sizeof who, "task %u:", i);
        assert_warned(p, who, "whose shares went to earlier tasks");
    }
    for (unsigned i = 0; i < 8; ++i)
        assert_int_equal(zb_plan_task_gpu_node(p, i), gpu[i]);
    assert_int_equal(zb_plan_task_gpu_node(p, 8), -1);
    assert_int_equal(zb_plan_task_gpu_node(plain, 0), -1);
    /* Without GPUs: topology order. */
    for (unsigned i = 0; i < 8; ++i) {
        char expected[8];
        snprintf(expected, sizeof expected, "%u", i);
        assert_string_equal(nodes(plain, i), expected);
    }
    zb_plan_free(plain);
    zb_plan_free(p);
    zb_topology_free(t);
}

/* 16 ranks, two per NUMA node, whose GPUs' nodes are a permutation of the nodes (each node twice,
 * e.g. 16 GPUs, two per node): every rank lands on its GPU's node, no warning. The two ranks on
 * node 3 get its two shares in task order. */
static void every_rank_on_its_gpu_node(void **state) {
    (void)state;
    zb_topology_t *t = topology(DGX);
    int gpu[16];
    const int per_gpu[] = {3, 1, 7, 5, 0, 2, 4, 6};
    for (int i = 0; i < 16; ++i)
        gpu[i] = per_gpu[i / 2];
    zb_plan_t *p = plan_same_shares(t, NULL, 16, gpu);
    for (unsigned i = 0; i < 16; ++i) {
        char expected[8];
        snprintf(expected, sizeof expected, "%d", gpu[i]);
        assert_string_equal(nodes(p, i), expected);
    }
    char a[64], b[64];
    zb_cpulist_format(task(p, 0).cpus, a, sizeof a);
    zb_cpulist_format(task(p, 1).cpus, b, sizeof b);
    assert_string_equal(a, "12-13");
    assert_string_equal(b, "14-15");
    for (unsigned i = 0; i < zb_plan_nwarnings(p); ++i)
        assert_null(strstr(zb_plan_warning(p, i), "GPU"));
    zb_plan_free(p);
    zb_topology_free(t);
}

/* Two sockets, GPUs numbered from socket 1: task 0 goes to node 1. gpu=ignore and a NULL list
 * give the plain order; the same inputs give the same plan. */
static void two_sockets(void **state) {
    (void)state;
    zb_topology_t *t = topology(TWO_SOCKETS);
    const int gpu[] = {1, 0};
    zb_plan_t *p = plan(t, NULL, 2, "", gpu);
    assert_string_equal(nodes(p, 0), "1");
    assert_string_equal(nodes(p, 1), "0");
    assert_int_equal(zb_plan_nwarnings(p), 0);
    zb_plan_t *again = plan(t, NULL, 2, "", gpu);
    for (unsigned i = 0; i < 2; ++i)
        assert_true(zb_cpuset_isequal(task(p, i).cpus, task(again, i).cpus));
    zb_plan_t *ignored = plan(t, NULL, 2, "gpu=ignore", gpu);
    assert_string_equal(nodes(ignored, 0), "0");
    assert_string_equal(nodes(ignored, 1), "1");
    assert_int_equal(zb_plan_nwarnings(ignored), 0);
    /* A task without a GPU takes what the others left. */
    const int partial[] = {-1, 0};
    zb_plan_t *q = plan(t, NULL, 2, "", partial);
    assert_string_equal(nodes(q, 0), "1");
    assert_string_equal(nodes(q, 1), "0");
    /* (no GPU, or one whose node is unknown: the caller says which) */
    assert_warned(q, "task 0:", "no GPU of a known NUMA node");
    zb_plan_free(q);
    zb_plan_free(ignored);
    zb_plan_free(again);
    zb_plan_free(p);
    zb_topology_free(t);
}

/* The step owns CPUs on nodes 0-2 only (Slurm gave it part of the node); task 0's GPU is on node
 * 3: it gets the nearest node with a share left, on its package, and a warning says node 3 has
 * none of the step's CPUs. */
static void gpu_on_node_without_step_cpus(void **state) {
    (void)state;
    zb_topology_t *t = topology(DGX);
    const int gpu[] = {3, 0, 1};
    zb_plan_t *p = plan_same_shares(t, "0-11", 3, gpu);
    assert_string_equal(nodes(p, 1), "0");
    assert_string_equal(nodes(p, 2), "1");
    assert_string_equal(nodes(p, 0), "2");
    assert_warned(p, "task 0:", "NUMA node 3, which has no CPU of the step: share on NUMA node 2");
    zb_plan_free(p);
    zb_topology_free(t);
}

/* hwloc's distances win over the tree: with a matrix that puts node 3 next to node 5 (on the
 * other package), task 0, whose GPU is on node 3 outside the step, goes to node 5. */
static void firmware_distances(void **state) {
    (void)state;
    zb_topology_t *t = topology(DGX);
    hwloc_topology_t h = zb_topology_hwloc(t);
    hwloc_obj_t objs[8];
    hwloc_uint64_t values[64];
    for (unsigned i = 0; i < 8; ++i)
        objs[i] = hwloc_get_numanode_obj_by_os_index(h, i);
    for (unsigned i = 0; i < 8; ++i)
        for (unsigned j = 0; j < 8; ++j)
            values[i * 8 + j] = i == j ? 10 : (i / 4 == j / 4 ? 12 : 32);
    values[3 * 8 + 5] = values[5 * 8 + 3] = 11;
    hwloc_distances_add_handle_t handle = hwloc_distances_add_create(
        h, "test", HWLOC_DISTANCES_KIND_FROM_USER | HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0);
    assert_non_null(handle);
    assert_int_equal(hwloc_distances_add_values(h, handle, 8, objs, values, 0), 0);
    assert_int_equal(hwloc_distances_add_commit(h, handle, 0), 0);

    const int gpu[] = {3, -1};
    /* The step: nodes 2 (CPUs 8-11) and 5 (20-23). By the tree node 2 is nearer. */
    zb_plan_t *p = plan(t, "8-11,20-23", 2, "", gpu);
    assert_string_equal(nodes(p, 0), "5");
    assert_string_equal(nodes(p, 1), "2");
    assert_warned(p, "task 0:", "share on NUMA node 5, the nearest left");
    zb_plan_free(p);
    zb_topology_free(t);

    /* The same without the matrix: the tree says node 2. */
    t = topology(DGX);
    p = plan(t, "8-11,20-23", 2, "", gpu);
    assert_string_equal(nodes(p, 0), "2");
    zb_plan_free(p);
    zb_topology_free(t);
}

/* A share that spans two nodes counts for both: 4 tasks on 8 nodes, each share on two nodes; a
 * task whose GPU is on the second node of a share takes that share without a warning. */
static void shares_across_nodes(void **state) {
    (void)state;
    zb_topology_t *t = topology(DGX);
    const int gpu[] = {3, 1, 7, 5};
    zb_plan_t *p = plan_same_shares(t, NULL, 4, gpu);
    assert_string_equal(nodes(p, 0), "2-3");
    assert_string_equal(nodes(p, 1), "0-1");
    assert_string_equal(nodes(p, 2), "6-7");
    assert_string_equal(nodes(p, 3), "4-5");
    for (unsigned i = 0; i < zb_plan_nwarnings(p); ++i)
        assert_null(strstr(zb_plan_warning(p, i), "GPU"));
    zb_plan_free(p);
    zb_topology_free(t);

    /* Two free shares touch the GPU's node: the one with more cores there wins. Three tasks on
     * two nodes of 8 cores: shares 0-4, 5-9 (two cores on node 1), 10-15 (six). */
    t = topology(TWO_SOCKETS);
    const int one[] = {1, -1, -1};
    p = plan(t, NULL, 3, "", one);
    assert_string_equal(nodes(p, 0), "1");
    assert_int_equal(task(p, 0).cores, 6);
    zb_plan_free(p);
    zb_topology_free(t);
}

/* Impossible cases fall back to order with a warning: a GPU node the topology does not have, and
 * more tasks than cores (tasks share cores round-robin). */
static void fallbacks(void **state) {
    (void)state;
    zb_topology_t *t = topology(TWO_SOCKETS);
    const int gpu[] = {42, 0};
    zb_plan_t *p = plan(t, NULL, 2, "", gpu);
    assert_string_equal(nodes(p, 0), "1");
    assert_string_equal(nodes(p, 1), "0");
    assert_warned(p, "task 0:", "NUMA node 42, which is not in the topology");
    zb_plan_free(p);

    int many[20];
    for (int i = 0; i < 20; ++i)
        many[i] = 1;
    p = plan(t, NULL, 20, "", many);
    zb_plan_t *plain = plan(t, NULL, 20, "", NULL);
    for (unsigned i = 0; i < 20; ++i)
        assert_true(zb_cpuset_isequal(task(p, i).cpus, task(plain, i).cpus));
    assert_warned(p, "tasks share cores round-robin", "not placed by their GPUs");
    zb_plan_free(plain);
    zb_plan_free(p);
    zb_topology_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dgx_one_rank_per_gpu),
        cmocka_unit_test(every_rank_on_its_gpu_node),
        cmocka_unit_test(two_sockets),
        cmocka_unit_test(gpu_on_node_without_step_cpus),
        cmocka_unit_test(firmware_distances),
        cmocka_unit_test(shares_across_nodes),
        cmocka_unit_test(fallbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
