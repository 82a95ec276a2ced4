/* The planner on the seed machines and on invariants over random inputs. */
#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* node0 = CPUs 0-15,32-47, node1 = 16-31,48-63; siblings are c and c+32. */
static const char *seed = "pack:2 [numa] core:16 pu:2(indexes=core:pack)";

typedef struct {
    zb_topology_t *topo;
    zb_plan_t *plan;
    zb_status status;
} planned;

/* topology: an hwloc synthetic description, or the path of an XML file (starting with '/'). */
static planned plan_for(const char *topology, const char *allowed_list, unsigned ntasks,
                        const char *opts) {
    planned p = {NULL, NULL, ZB_OK};
    zb_options o;
    if (topology[0] == '/')
        assert_int_equal(zb_topology_load_xml(topology, &p.topo), ZB_OK);
    else
        assert_int_equal(zb_topology_load_synthetic(topology, &p.topo), ZB_OK);
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    if (allowed_list) assert_int_equal(zb_cpulist_parse(allowed_list, allowed), ZB_OK);
    zb_options_init(&o);
    assert_int_equal(zb_options_parse(&o, opts, ZB_SCOPE_USER), ZB_OK);
    p.status = zb_plan_compute(p.topo, allowed_list ? allowed : zb_topology_cpuset(p.topo), ntasks,
                               &o, NULL, 0, &p.plan);
    zb_cpuset_free(allowed);
    return p;
}

static void release(planned *p) {
    zb_plan_free(p->plan);
    zb_topology_free(p->topo);
}

static const char *fmt(const zb_cpuset_t *set) {
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ % 4];
    zb_cpulist_format(set, b, 512);
    return b;
}

/* "train|opt|train_threads|opt_threads|mems" of one task, for compact assertions. */
static const char *summary(const planned *p, unsigned task) {
    static char buf[2048];
    zb_task_plan t;
    assert_int_equal(zb_plan_task(p->plan, task, &t), ZB_OK);
    snprintf(buf, sizeof buf, "%s|%s|%u|%u|%s", fmt(t.train_cpus), fmt(t.opt_cpus), t.train_threads,
             t.opt_threads, fmt(t.opt_mems));
    return buf;
}

static int has_warning(const planned *p, const char *needle) {
    for (unsigned i = 0; i < zb_plan_nwarnings(p->plan); ++i)
        if (strstr(zb_plan_warning(p->plan, i), needle)) return 1;
    return 0;
}

/* The seed machine planned on `allowed` for `ntasks` with `opts` succeeds; task `task`'s summary
 * is `want` and, unless `warning` is NULL, a warning holds `warning`. */
static void expect_summary(const char *allowed, unsigned ntasks, const char *opts, unsigned task,
                           const char *want, const char *warning) {
    planned p = plan_for(seed, allowed, ntasks, opts);
    if (p.status != ZB_OK) fail_msg("%s on %s: %s", opts, allowed, zb_last_error());
    assert_string_equal(summary(&p, task), want);
    if (warning && !has_warning(&p, warning))
        fail_msg("%s on %s: no warning '%s'", opts, allowed, warning);
    release(&p);
}

/* The seed machine planned on `allowed` for `ntasks` with `opts` is impossible, and the message
 * holds `needle` (NULL: any). */
static void expect_impossible(const char *allowed, unsigned ntasks, const char *opts,
                              const char *needle) {
    planned p = plan_for(seed, allowed, ntasks, opts);
    assert_int_equal(p.status, ZB_EIMPOSSIBLE);
    if (needle && !strstr(zb_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", zb_last_error(), needle);
    release(&p);
}

static void one_task_on_the_seed_machine(void **state) {
    (void)state;
    planned p = plan_for(seed, NULL, 1, "");
    assert_int_equal(p.status, ZB_OK);
    /* 32 cores, 16 for the optimizer: the last 16 of node 0 (its main node: a tie, the first) */
    assert_string_equal(summary(&p, 0), "16-31,48-63|0-15|16|16|0");
    release(&p);
}

static void two_tasks_get_one_numa_node_each(void **state) {
    (void)state;
    planned p = plan_for(seed, NULL, 2, "");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "0-7,32-39|8-15|8|8|0");
    assert_string_equal(summary(&p, 1), "16-23,48-55|24-31|8|8|1");
    assert_int_equal(zb_plan_nwarnings(p.plan), 0);
    release(&p);
}

static void eight_tasks_on_two_sockets_stay_inside_their_node(void **state) {
    (void)state;
    planned p = plan_for(seed, NULL, 8, "");
    assert_int_equal(p.status, ZB_OK);
    for (unsigned i = 0; i < 8; ++i) {
        zb_task_plan t;
        assert_int_equal(zb_plan_task(p.plan, i, &t), ZB_OK);
        assert_int_equal(t.cores, 4);
        assert_int_equal(zb_cpuset_weight(t.nodes), 1);
        assert_int_equal(zb_cpuset_next(t.nodes, -1), i < 4 ? 0 : 1);
        assert_int_equal(t.train_threads, 2);
        assert_int_equal(t.opt_threads, 2);
    }
    assert_string_equal(summary(&p, 0), "0-1,32-33|2-3|2|2|0");
    assert_string_equal(summary(&p, 5), "20-21,52-53|22-23|2|2|1");
    release(&p);
}

static void sparse_slurm_mask_never_leaves_the_allowed_cpus(void **state) {
    (void)state;
    /* node0: cores 0-14 (via 0,4-11 and siblings 32-46), node1: cores 21-26,30,31 */
    planned p = plan_for(seed, "0,4-11,21-26,30-46", 2, "");
    assert_int_equal(p.status, ZB_OK);
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc(), all = hwloc_bitmap_alloc();
    zb_cpulist_parse("0,4-11,21-26,30-46", zb_cpuset_from_hwloc(allowed));
    for (unsigned i = 0; i < 2; ++i) {
        zb_task_plan t;
        zb_plan_task(p.plan, i, &t);
        assert_true(hwloc_bitmap_isincluded(zb_cpuset_hwloc_const(t.cpus), allowed));
        assert_false(hwloc_bitmap_intersects(zb_cpuset_hwloc_const(t.cpus), all));
        hwloc_bitmap_or(all, all, zb_cpuset_hwloc_const(t.cpus));
    }
    /* 23 cores: 12 + 11; task 0 fills node 0 (15 cores) - it cannot cross less than once */
    zb_task_plan t0, t1;
    zb_plan_task(p.plan, 0, &t0);
    zb_plan_task(p.plan, 1, &t1);
    assert_int_equal(t0.cores + t1.cores, 23);
    assert_true(t0.cores == 12 || t0.cores == 11);
    /* every allowed core serves a task (only SMT siblings of optimizer cores stay idle) */
    hwloc_obj_t core = NULL;
    hwloc_topology_t h = zb_topology_hwloc(p.topo);
    while ((core = hwloc_get_next_obj_covering_cpuset_by_type(h, allowed, HWLOC_OBJ_CORE, core)))
        assert_true(hwloc_bitmap_intersects(core->cpuset, all));
    /* core 0's PUs are 0 and 32; 1-3 are not allowed, so 33-35 alone stand for cores 1-3 */
    assert_true(zb_cpuset_isset(t0.cpus, 33));
    assert_false(zb_cpuset_isset(t0.cpus, 1));
    hwloc_bitmap_free(allowed);
    hwloc_bitmap_free(all);
    release(&p);
}

static void high_cpu_ids_of_a_big_machine(void **state) {
    (void)state;
    planned p = plan_for("pack:2 [numa] core:64 pu:1", "64,97-127", 1, "");
    assert_int_equal(p.status, ZB_OK);
    /* 32 cores on node 1, 16 each; the optimizer takes the last ones */
    assert_string_equal(summary(&p, 0), "64,97-111|112-127|16|16|1");
    release(&p);
}

static void smt_options(void **state) {
    (void)state;
    expect_summary("0-3,32-35", 1, "smt=idle", 0, "0-1,32-33|2-3|2|2|0", NULL);
    expect_summary("0-3,32-35", 1, "smt=train", 0, "0-1,32-35|2-3|2|2|0", NULL);
    expect_summary("0-3,32-35", 1, "smt=opt", 0, "0-1,32-33|2-3,34-35|2|4|0", NULL);
}

static void train_and_opt_options(void **state) {
    (void)state;
    expect_summary("0-7", 1, "opt=2", 0, "0-5|6-7|6|2|0", NULL);
    expect_summary("0-7", 1, "train=0.25", 0, "0-1|2-7|2|6|0", NULL);
    expect_summary("0-7", 1, "train=3", 0, "0-2|3-7|3|5|0", NULL);
    /* 3 cores idle, said so */
    expect_summary("0-7", 1, "train=2,opt=3", 0, "0-1|5-7|2|3|0", "3 of its 8 cores stay idle");
    /* clamped: one core stays for training */
    expect_summary("0-7", 1, "opt=20", 0, "0|1-7|1|7|0", "no training core");
    expect_impossible("0-7", 1, "train=5,opt=5", "8 cores");
    /* 0.05 x 8 rounds to no training core: one, as without opt= */
    expect_summary("0-7", 1, "train=0.05,opt=1", 0, "0|7|1|1|0", "rounds to none");
}

/* Cores that explicit train= and opt= leave idle are the ones away from the optimizer's node:
 * training stays on it (and numa=strict holds where the used cores fit one node). */
static void training_keeps_to_the_optimizers_node(void **state) {
    (void)state;
    const char *two_nodes = "pack:2 [numa] core:4 pu:1"; /* node 0: CPUs 0-3, node 1: 4-7 */
    planned p = plan_for(two_nodes, "3-7", 1, "train=1,opt=1,numa=strict");
    if (p.status != ZB_OK) fail_msg("%s", zb_last_error());
    assert_string_equal(summary(&p, 0), "4|7|1|1|1");
    release(&p);
    p = plan_for(two_nodes, "3-7", 1, "train=2,opt=1");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "4-5|7|2|1|1");
    release(&p);
}

/* A PU with no core object above it is a core of its own: none of the step's CPUs is dropped,
 * and a step of only such CPUs plans (it divided by zero cores before). */
static const char *no_cores_xml = ZB_SOURCE_DIR "/tests/topologies/pus_without_cores.xml";

static void pus_without_cores_are_cores(void **state) {
    (void)state;
    planned p = plan_for(no_cores_xml, "4-7", 2, "");
    if (p.status != ZB_OK) fail_msg("%s", zb_last_error());
    assert_string_equal(summary(&p, 0), "4|5|1|1|1");
    assert_string_equal(summary(&p, 1), "6|7|1|1|1");
    release(&p);
    p = plan_for(no_cores_xml, NULL, 3, "");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "0-1|2|1|1|0"); /* package 0's cores keep their PUs */
    assert_string_equal(summary(&p, 1), "4|5|1|1|1");
    assert_string_equal(summary(&p, 2), "6|7|1|1|1");
    release(&p);
}

static void numa_strict_and_ignore(void **state) {
    (void)state;
    expect_impossible("0-23", 1, "numa=strict", "numa=strict");
    expect_impossible("0-23", 2, "numa=strict", NULL); /* 12 + 12 crosses once, unavoidably */
    planned p = plan_for(seed, NULL, 2, "numa=strict");
    assert_int_equal(p.status, ZB_OK);
    release(&p);
    p = plan_for(seed, "0-23", 1, "numa=ignore");
    assert_int_equal(p.status, ZB_OK);
    release(&p);
}

/* Where hwloc's core order is not grouped by home node, prefer groups the cores by node and ignore
 * keeps topology order. On machines whose NUMA nodes all hold their CPUs' memory the two orders
 * agree; here packages 0 and 2 have DRAM nodes P#1 and P#2, packages 1 and 3 only the machine-wide
 * NVM node P#0, so the home nodes in topology order are 1, 0, 2, 0. */
static const char *nvm_xml = ZB_SOURCE_DIR "/tests/topologies/dram_and_nvm.xml";

static const char *cpus_and_nodes(const planned *p, unsigned task) {
    static char buf[256];
    zb_task_plan t;
    assert_int_equal(zb_plan_task(p->plan, task, &t), ZB_OK);
    snprintf(buf, sizeof buf, "%s|%s", fmt(t.cpus), fmt(t.nodes));
    return buf;
}

static void numa_ignore_differs_from_prefer(void **state) {
    (void)state;
    planned p = plan_for(nvm_xml, NULL, 2, "numa=prefer");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(cpus_and_nodes(&p, 0), "0-1,4-5|1-2");
    assert_string_equal(cpus_and_nodes(&p, 1), "2-3,6-7|0"); /* one node: fewer in total */
    release(&p);
    p = plan_for(nvm_xml, NULL, 2, "numa=ignore");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(cpus_and_nodes(&p, 0), "0-3|0-1");
    assert_string_equal(cpus_and_nodes(&p, 1), "4-7|0,2");
    release(&p);
}

static void interleaved_sockets_follow_the_topology_not_the_ids(void **state) {
    (void)state;
    /* node 0 = even CPUs, node 1 = odd CPUs */
    planned p = plan_for("pack:2 [numa] core:4 pu:1(indexes=0,2,4,6,1,3,5,7)", NULL, 2, "");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "0,2|4,6|2|2|0");
    assert_string_equal(summary(&p, 1), "1,3|5,7|2|2|1");
    release(&p);
}

static void memory_only_nodes_hold_no_tasks(void **state) {
    (void)state;
    /* each package: one NUMA node with CPUs plus an HBM-like node without */
    planned p = plan_for("pack:2 [numa] [numa] core:4 pu:1", NULL, 2, "");
    assert_int_equal(p.status, ZB_OK);
    zb_task_plan t;
    for (unsigned i = 0; i < 2; ++i) {
        assert_int_equal(zb_plan_task(p.plan, i, &t), ZB_OK);
        assert_int_equal(t.cores, 4);
        assert_int_equal(zb_cpuset_weight(t.nodes), 1);
    }
    release(&p);
}

static void degenerate_cases_warn(void **state) {
    (void)state;
    expect_summary("5", 1, "", 0, "5|5|1|1|0", NULL);
    /* one core, both PUs: one optimizer thread on its first */
    expect_summary("5,37", 1, "", 0, "5,37|5|1|1|0", "single core");
    planned p = plan_for(seed, "0-1", 2, ""); /* each task its own core */
    assert_string_equal(summary(&p, 0), "0|0|1|1|0");
    assert_string_equal(summary(&p, 1), "1|1|1|1|0");
    assert_true(has_warning(&p, "tasks 0-1: a single core"));
    release(&p);
    /* more tasks than cores */
    expect_summary("0-1", 3, "", 2, "0|0|1|1|0", "3 tasks but only 2 cores");
    /* train= and opt= together cannot fit one core: impossible, not passed over (one alone is
     * a preference the single core overrides) */
    expect_impossible("5", 1, "train=2,opt=2", "fewer than the 2 training + 2 optimizer");
    expect_impossible("5,37", 1, "train=0.5,opt=1", "1 cores, fewer than");
    expect_summary("5", 1, "opt=2", 0, "5|5|1|1|0", "single core");
}

/* mode=offload: the same shares, but each is all training, every PU, one thread per core. */
static void offload_mode_gives_the_whole_share(void **state) {
    (void)state;
    planned p = plan_for(seed, NULL, 2, "mode=offload");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "0-15,32-47||16|0|0");
    assert_string_equal(summary(&p, 1), "16-31,48-63||16|0|1");
    assert_int_equal(zb_plan_nwarnings(p.plan), 0);
    release(&p);
    /* The sparse mask: whole cores only where Slurm gave them, siblings included. */
    p = plan_for(seed, "0,4-11,21-26,30-46", 2, "mode=offload");
    assert_int_equal(p.status, ZB_OK);
    zb_task_plan t;
    assert_int_equal(zb_plan_task(p.plan, 0, &t), ZB_OK);
    assert_string_equal(fmt(t.cpus), fmt(t.train_cpus));
    assert_int_equal(zb_cpuset_weight(t.opt_cpus), 0);
    assert_int_equal(t.train_threads, t.cores);
    release(&p);
    p = plan_for(seed, "5,37", 1, "mode=offload"); /* one core: no "shared with the optimizer" */
    assert_string_equal(summary(&p, 0), "5,37||1|0|0");
    assert_int_equal(zb_plan_nwarnings(p.plan), 0);
    release(&p);
    p = plan_for(seed, NULL, 2, "mode=offload,opt=4");
    assert_int_equal(p.status, ZB_OK);
    assert_string_equal(summary(&p, 0), "0-15,32-47||16|0|0");
    assert_true(has_warning(&p, "train=, opt= and profile= do not apply"));
    release(&p);
    p = plan_for(seed, NULL, 2, "mode=offload,profile=/etc/p"); /* a profile alone warns too */
    assert_true(has_warning(&p, "profile= do not apply"));
    release(&p);
}

static void bad_input_is_refused_with_a_message(void **state) {
    (void)state;
    planned p = plan_for(seed, "0-70", 1, "");
    assert_int_equal(p.status, ZB_EINVAL);
    assert_string_equal(zb_last_error(), "CPUs 64-70 are not in the topology (0-63)");
    release(&p);
    p = plan_for(seed, "", 1, "");
    assert_int_equal(p.status, ZB_EINVAL);
    release(&p);
    p = plan_for(seed, NULL, 0, "");
    assert_int_equal(p.status, ZB_EINVAL);
    release(&p);
    zb_task_plan t;
    p = plan_for(seed, NULL, 2, "");
    assert_int_equal(zb_plan_task(p.plan, 2, &t), ZB_EINVAL);
    assert_null(zb_plan_warning(p.plan, 99));
    release(&p);
}

/* zb_plan_compute on the seed machine with `flags` and options of size `size` is refused with
 * ZB_EINVAL, a message holding `needle`, and no plan. */
static void expect_refused(unsigned long flags, size_t size, const int *gpu_nodes,
                           const char *needle) {
    zb_topology_t *topo;
    assert_int_equal(zb_topology_load_synthetic(seed, &topo), ZB_OK);
    zb_options o;
    zb_options_init(&o);
    o.size = size;
    zb_plan_t *plan = NULL;
    assert_int_equal(
        zb_plan_compute(topo, zb_topology_cpuset(topo), 2, &o, gpu_nodes, flags, &plan), ZB_EINVAL);
    if (!strstr(zb_last_error(), needle) || !strstr(zb_last_error(), "zb_plan_compute"))
        fail_msg("message \"%s\" lacks zb_plan_compute or \"%s\"", zb_last_error(), needle);
    assert_null(plan);
    zb_topology_free(topo);
}

/* ABI 2: flags is 0 in this release, and options come from zb_options_init. */
static void flags_and_short_options_are_refused(void **state) {
    (void)state;
    const int gpu_nodes[] = {1, 0};
    expect_refused(1, sizeof(zb_options), NULL, "flags");
    expect_refused(0x10, sizeof(zb_options), gpu_nodes, "flags");
    expect_refused(~0ul, sizeof(zb_options), NULL, "flags");
    expect_refused(0, sizeof(zb_options) - 1, NULL, "zb_options_init");
    expect_refused(0, 0, gpu_nodes, "size");
    /* the same call with flags 0 and a whole zb_options plans */
    planned p = plan_for(seed, NULL, 2, "");
    assert_int_equal(p.status, ZB_OK);
    assert_int_equal(zb_plan_ntasks(p.plan), 2);
    release(&p);
}

/* Invariants over many random masks, topologies, task counts and options. */
static void invariants_hold_on_random_inputs(void **state) {
    (void)state;
    static const char *topologies[] = {"pack:2 [numa] core:16 pu:2(indexes=core:pack)",
                                       "pack:2 [numa] core:8 pu:1",
                                       "pack:4 [numa] core:3 pu:2",
                                       "numa:2 pack:1 core:5 pu:4",
                                       "core:6 pu:1",
                                       "pack:2 [numa] [numa] core:4 pu:2"};
    static const char *options[] = {"",      "smt=train",  "smt=opt",
                                    "opt=1", "train=0.75", "numa=ignore"};
    unsigned seedval = 12345;
    for (int iter = 0; iter < 600; ++iter) {
        const char *topo_s = topologies[iter % 6];
        zb_topology_t *topo;
        assert_int_equal(zb_topology_load_synthetic(topo_s, &topo), ZB_OK);
        hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
        const zb_cpuset_t *all = zb_topology_cpuset(topo);
        for (int cpu = zb_cpuset_next(all, -1); cpu >= 0; cpu = zb_cpuset_next(all, cpu)) {
            seedval = seedval * 1103515245u + 12345u;
            if ((seedval >> 16) % 3) hwloc_bitmap_set(allowed, (unsigned)cpu);
        }
        if (hwloc_bitmap_iszero(allowed)) hwloc_bitmap_set(allowed, 0);
        seedval = seedval * 1103515245u + 12345u;
        const unsigned ntasks = 1 + (seedval >> 16) % 12;
        zb_options o;
        zb_options_init(&o);
        zb_options_parse(&o, options[(iter / 6) % 6], ZB_SCOPE_USER);
        zb_plan_t *a, *b;
        const zb_cpuset_t *allowed_set = zb_cpuset_from_hwloc(allowed);
        assert_int_equal(zb_plan_compute(topo, allowed_set, ntasks, &o, NULL, 0, &a), ZB_OK);
        assert_int_equal(zb_plan_compute(topo, allowed_set, ntasks, &o, NULL, 0, &b), ZB_OK);
        assert_int_equal(zb_plan_ntasks(a), ntasks);

        hwloc_topology_t h = zb_topology_hwloc(topo);
        const int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(h, allowed, HWLOC_OBJ_CORE);
        hwloc_bitmap_t seen = hwloc_bitmap_alloc();
        unsigned min_cores = ~0u, max_cores = 0;
        for (unsigned i = 0; i < ntasks; ++i) {
            zb_task_plan t, u;
            zb_plan_task(a, i, &t);
            zb_plan_task(b, i, &u);
            /* deterministic */
            assert_true(zb_cpuset_isequal(t.train_cpus, u.train_cpus));
            assert_true(zb_cpuset_isequal(t.opt_cpus, u.opt_cpus));
            /* inside the allowed set, train | opt = the task's CPUs */
            hwloc_const_bitmap_t cpus = zb_cpuset_hwloc_const(t.cpus),
                                 train = zb_cpuset_hwloc_const(t.train_cpus),
                                 opt = zb_cpuset_hwloc_const(t.opt_cpus);
            assert_true(hwloc_bitmap_isincluded(cpus, allowed));
            hwloc_bitmap_t both = hwloc_bitmap_alloc();
            hwloc_bitmap_or(both, train, opt);
            assert_true(zb_cpuset_isequal(zb_cpuset_from_hwloc(both), t.cpus));
            hwloc_bitmap_free(both);
            assert_true(t.train_threads >= 1 && t.opt_threads >= 1);
            assert_int_equal((int)t.opt_threads, zb_cpuset_weight(t.opt_cpus));
            /* whole cores to one task: a task's CPUs never share a core with another's */
            if ((int)ntasks <= ncores) {
                hwloc_obj_t core = NULL;
                while ((core = hwloc_get_next_obj_covering_cpuset_by_type(h, cpus, HWLOC_OBJ_CORE,
                                                                          core))) {
                    hwloc_bitmap_t mine = hwloc_bitmap_alloc();
                    hwloc_bitmap_and(mine, core->cpuset, allowed);
                    assert_false(hwloc_bitmap_intersects(mine, seen));
                    hwloc_bitmap_free(mine);
                }
                /* training and optimizer cores are disjoint unless the task has one core */
                if (t.cores > 1) assert_false(hwloc_bitmap_intersects(train, opt));
            }
            hwloc_bitmap_or(seen, seen, cpus);
            if (t.cores < min_cores) min_cores = t.cores;
            if (t.cores > max_cores) max_cores = t.cores;
        }
        assert_true(max_cores - min_cores <= 1); /* equal shares within one core */
        /* nothing lost: every allowed core serves a task (smt=idle leaves only siblings idle) */
        hwloc_obj_t core = NULL;
        while (
            (core = hwloc_get_next_obj_covering_cpuset_by_type(h, allowed, HWLOC_OBJ_CORE, core)))
            assert_true(hwloc_bitmap_intersects(core->cpuset, seen));
        hwloc_bitmap_free(seen);
        zb_plan_free(a);
        zb_plan_free(b);
        hwloc_bitmap_free(allowed);
        zb_topology_free(topo);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_task_on_the_seed_machine),
        cmocka_unit_test(two_tasks_get_one_numa_node_each),
        cmocka_unit_test(eight_tasks_on_two_sockets_stay_inside_their_node),
        cmocka_unit_test(sparse_slurm_mask_never_leaves_the_allowed_cpus),
        cmocka_unit_test(high_cpu_ids_of_a_big_machine),
        cmocka_unit_test(smt_options),
        cmocka_unit_test(train_and_opt_options),
        cmocka_unit_test(training_keeps_to_the_optimizers_node),
        cmocka_unit_test(pus_without_cores_are_cores),
        cmocka_unit_test(numa_strict_and_ignore),
        cmocka_unit_test(numa_ignore_differs_from_prefer),
        cmocka_unit_test(interleaved_sockets_follow_the_topology_not_the_ids),
        cmocka_unit_test(memory_only_nodes_hold_no_tasks),
        cmocka_unit_test(degenerate_cases_warn),
        cmocka_unit_test(offload_mode_gives_the_whole_share),
        cmocka_unit_test(bad_input_is_refused_with_a_message),
        cmocka_unit_test(flags_and_short_options_are_refused),
        cmocka_unit_test(invariants_hold_on_random_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
