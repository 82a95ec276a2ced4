// The planner: a pure function from (topology, allowed CPUs, local task count, options) to each
// task's training and optimizer CPUs. Every task of a node computes the same plan and takes its
// own share, so the rules below must be deterministic and must never read CPU-id order as a
// topology: only hwloc's objects say which CPUs are siblings and which NUMA node holds them.
//
// 1. Cores: hwloc cores (a PU without a core above it is one) with at least one allowed PU; a
//    core keeps only its allowed PUs. Whole cores go to one task.
// 2. Sequence: cores grouped by NUMA node (nodes in topology order; numa=ignore: no grouping),
//    in topology order inside a node. NUMA nodes without CPUs hold no cores.
// 3. Shares: tasks take consecutive runs of the sequence, sizes floor(C/T) or that plus one; which
//    tasks get the larger runs is chosen (dynamic programming) to minimise the NUMA boundaries
//    crossed, so tasks that divide over the nodes get one node each. More tasks than cores: task
//    i shares core i mod C.
// 4. Inside a task: the optimizer gets its cores from the node holding most of the task's cores,
//    the last ones in sequence order; training gets the rest with all their PUs (where explicit
//    train= and opt= leave some idle, it takes the first of that node's first).
// 5. mode=offload: no split; the training process gets every PU of its share and one thread per
//    core, for optimizers that run inside it (rules 1-3 unchanged).
// 6. GPUs (zb_plan_compute with gpu_nodes): the shares of rule 3 are dealt to the tasks by their
// GPU's
//    NUMA node (gpu_place.hpp) instead of in order; the CPUs used stay the same.
#include "bitmap.hpp"
#include "cpulist.hpp"
#include "error.hpp"
#include "gpu_place.hpp"
#include "topology.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

struct zb_plan {
    struct Task {
        zb::Bitmap cpus, train, opt, nodes, mems;
        unsigned train_threads = 0, opt_threads = 0, cores = 0;
    };
    std::vector<Task> tasks;
    std::vector<std::string> warnings;
    std::vector<int> gpu_nodes; // as given, one per task (-1: none)
};

namespace {

using zb::Bitmap;

struct Core {
    Bitmap pus;   // allowed PUs of the core
    int node = 0; // index into the node list
};

struct Machine {
    std::vector<unsigned> node_os; // home NUMA nodes (OS numbers), in topology order
    std::vector<Core> seq;         // cores in planning order (rule 2)
};

// Groups per-task messages: the same text for tasks 0-7 becomes one warning "tasks 0-7: ...".
class Warnings {
  public:
    void add(unsigned task, const std::string &text) {
        for (auto &[t, tasks] : items_)
            if (t == text) {
                hwloc_bitmap_set(tasks, task);
                return;
            }
        items_.emplace_back(text, Bitmap());
        hwloc_bitmap_set(items_.back().second, task);
    }
    void add_global(const std::string &text) { global_.push_back(text); }
    std::vector<std::string> take() {
        std::vector<std::string> out = std::move(global_);
        for (auto &[text, tasks] : items_)
            out.push_back((hwloc_bitmap_weight(tasks) == 1 ? "task " : "tasks ") +
                          zb::format_cpulist(tasks) + ": " + text);
        return out;
    }

  private:
    std::vector<std::pair<std::string, Bitmap>> items_;
    std::vector<std::string> global_;
};

std::string list(hwloc_const_bitmap_t set) {
    return zb::format_cpulist(set);
}

Machine build_machine(hwloc_topology_t topo, hwloc_const_cpuset_t allowed, zb_numa numa) {
    Machine m;
    const std::vector<hwloc_obj_t> nodes = zb::cpu_nodes(topo);
    for (hwloc_obj_t n : nodes)
        m.node_os.push_back(n->os_index);
    if (m.node_os.empty()) m.node_os.push_back(0); // no NUMA information: one node 0

    // Each allowed PU joins its core, in topology order; a PU without a core above it (a machine
    // or a package without core objects) is a core of its own.
    std::vector<Core> cores;
    hwloc_obj_t last = nullptr;
    for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, nullptr); pu;
         pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, pu)) {
        if (!hwloc_bitmap_isset(allowed, pu->os_index)) continue;
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
        if (!core) core = pu;
        if (core != last) cores.emplace_back(); // a core's PUs are its children, in a row
        last = core;
        hwloc_bitmap_set(cores.back().pus, pu->os_index);
    }
    for (Core &core : cores)
        core.node = std::max(0, zb::home_node(nodes, core.pus));
    if (numa != ZB_NUMA_IGNORE)
        std::stable_sort(cores.begin(), cores.end(),
                         [](const Core &a, const Core &b) { return a.node < b.node; });
    m.seq = std::move(cores);
    return m;
}

// Run lengths for `ntasks` tasks over the sequence (rule 3), fewest node boundaries crossed.
std::vector<size_t> share_sizes(const std::vector<Core> &seq, size_t ntasks) {
    const size_t total = seq.size(), base = total / ntasks, extra = total % ntasks;
    std::vector<int> boundary(total + 1, 0); // boundaries before position p, prefix-summed
    for (size_t p = 1; p < total; ++p)
        boundary[p + 1] = boundary[p] + (seq[p].node != seq[p - 1].node ? 1 : 0);
    const auto crossings = [&](size_t from, size_t len) {
        return len == 0 ? 0 : boundary[from + len] - boundary[from + 1];
    };
    // best[i][e]: fewest crossings for the first i tasks having used e larger runs.
    const size_t width = extra + 1;
    std::vector<int> best((ntasks + 1) * width, INT_MAX);
    std::vector<unsigned char> took((ntasks + 1) * width, 0);
    best[0] = 0;
    for (size_t i = 0; i < ntasks; ++i)
        for (size_t e = 0; e <= std::min(i, extra); ++e) {
            const int here = best[i * width + e];
            if (here == INT_MAX) continue;
            const size_t pos = i * base + e;
            if (e < extra) { // on a tie the path found first stays: deterministic
                const int c = here + crossings(pos, base + 1);
                if (c < best[(i + 1) * width + e + 1]) {
                    best[(i + 1) * width + e + 1] = c;
                    took[(i + 1) * width + e + 1] = 1;
                }
            }
            const int c = here + crossings(pos, base);
            if (c < best[(i + 1) * width + e]) {
                best[(i + 1) * width + e] = c;
                took[(i + 1) * width + e] = 0;
            }
        }
    std::vector<size_t> sizes(ntasks);
    for (size_t i = ntasks, e = extra; i > 0; --i) {
        const bool larger = took[i * width + e];
        sizes[i - 1] = base + (larger ? 1 : 0);
        e -= larger ? 1 : 0;
    }
    return sizes;
}

struct Split {
    unsigned train, opt; // train + opt <= k: explicit train= and opt= may leave cores idle
};

// How a task's `k` cores (k >= 2) divide between training and optimizer. May warn or fail.
Split split_cores(unsigned k, const zb_options &o, unsigned task, Warnings &warn) {
    const bool train_given = o.train_cores != 0 || o.train_fraction > 0;
    unsigned train = 0;
    if (o.train_cores) train = o.train_cores;
    if (o.train_fraction > 0) train = static_cast<unsigned>(std::lround(o.train_fraction * k));
    if (train_given && o.opt_cores) {
        if (train == 0) { // a fraction of a small share: at least one, as without opt=
            warn.add(task, "the train= fraction of its " + std::to_string(k) +
                               " cores rounds to none; training gets 1");
            train = 1;
        }
        if (train + o.opt_cores > k)
            zb::fail(ZB_EIMPOSSIBLE, "task " + std::to_string(task) + " has " + std::to_string(k) +
                                         " cores, fewer than the " + std::to_string(train) +
                                         " training + " + std::to_string(o.opt_cores) +
                                         " optimizer cores asked for");
        if (train + o.opt_cores < k)
            warn.add(task, std::to_string(k - train - o.opt_cores) + " of its " +
                               std::to_string(k) + " cores stay idle (train= and opt= leave them)");
        return {train, o.opt_cores};
    }
    unsigned opt = k / 2; // DeepSpeed ZenFlow's default: half for training, the larger half
    if (o.opt_cores) opt = o.opt_cores;
    if (train_given) opt = train >= k ? 0 : k - train;
    if (opt < 1 || opt > k - 1) {
        const unsigned clamped = std::clamp(opt, 1u, k - 1);
        warn.add(task, "the split asked for leaves " +
                           std::string(opt < 1 ? "no optimizer core" : "no training core") +
                           " out of " + std::to_string(k) + "; training gets " +
                           std::to_string(k - clamped) + ", the optimizer " +
                           std::to_string(clamped));
        opt = clamped;
    }
    return {k - opt, opt};
}

// A task whose training and optimizer share one core (the degenerate cases): training may use
// every PU of it, the optimizer's one thread its first PU.
zb_plan::Task shared_core_task(const Machine &m, const Core &core) {
    zb_plan::Task t;
    t.cpus = t.train = core.pus;
    hwloc_bitmap_only(t.opt, static_cast<unsigned>(hwloc_bitmap_first(core.pus)));
    t.train_threads = t.opt_threads = t.cores = 1;
    hwloc_bitmap_only(t.nodes, m.node_os[static_cast<size_t>(core.node)]);
    t.mems = t.nodes;
    return t;
}

// Rule 5: the whole share trains, one thread per core; memory on the share's nodes.
zb_plan::Task offload_task(const Machine &m, std::vector<Core>::const_iterator begin,
                           size_t count) {
    zb_plan::Task t;
    for (size_t i = 0; i < count; ++i) {
        hwloc_bitmap_or(t.train, t.train, begin[i].pus);
        hwloc_bitmap_set(t.nodes, m.node_os[static_cast<size_t>(begin[i].node)]);
    }
    t.cpus = t.train;
    t.mems = t.nodes;
    t.cores = t.train_threads = static_cast<unsigned>(count);
    return t;
}

// The node holding most of a run's cores (index into m.node_os); the first such on a tie.
int main_node(const Machine &m, size_t first, size_t count) {
    std::vector<unsigned> per_node(m.node_os.size(), 0);
    for (size_t i = first; i < first + count; ++i)
        ++per_node[static_cast<size_t>(m.seq[i].node)];
    return static_cast<int>(std::max_element(per_node.begin(), per_node.end()) - per_node.begin());
}

zb_plan::Task make_task(const Machine &m, size_t first, size_t count, const zb_options &o,
                        unsigned index, Warnings &warn) {
    const auto begin = m.seq.begin() + static_cast<long>(first);
    if (o.mode == ZB_MODE_OFFLOAD) return offload_task(m, begin, count);
    if (count == 1) {
        // train= and opt= together ask for two cores at least: impossible, as on any share too
        // small for both (split_cores says so), not passed over
        if ((o.train_cores != 0 || o.train_fraction > 0) && o.opt_cores)
            split_cores(1, o, index, warn);
        warn.add(index, "a single core: training and optimizer share it");
        return shared_core_task(m, *begin);
    }
    const unsigned k = static_cast<unsigned>(count);
    const Split split = split_cores(k, o, index, warn);
    const unsigned nopt = split.opt;

    const int main = main_node(m, first, count);

    // Optimizer: the last cores of the main node, then the last of the others.
    std::vector<bool> is_opt(count, false);
    unsigned chosen = 0;
    for (int pass = 0; pass < 2 && chosen < nopt; ++pass)
        for (size_t i = count; i-- > 0 && chosen < nopt;)
            if (!is_opt[i] && ((begin[i].node == main) == (pass == 0))) {
                is_opt[i] = true;
                ++chosen;
            }

    // Training: the first of the rest on the main node, then of the others (explicit train= and
    // opt= may leave cores idle: those away from the optimizer's node, first).
    std::vector<bool> is_train(count, false);
    unsigned trained = 0;
    for (int pass = 0; pass < 2 && trained < split.train; ++pass)
        for (size_t i = 0; i < count && trained < split.train; ++i)
            if (!is_opt[i] && !is_train[i] && ((begin[i].node == main) == (pass == 0))) {
                is_train[i] = true;
                ++trained;
            }

    zb_plan::Task t;
    t.cores = k;
    for (size_t i = 0; i < count; ++i) {
        const Core &c = begin[i];
        const unsigned node = m.node_os[static_cast<size_t>(c.node)];
        if (is_opt[i] || is_train[i]) hwloc_bitmap_set(t.nodes, node);
        if (is_opt[i]) {
            hwloc_bitmap_set(t.mems, node);
            const int first_pu = hwloc_bitmap_first(c.pus);
            if (o.smt == ZB_SMT_OPT) {
                hwloc_bitmap_or(t.opt, t.opt, c.pus);
            } else {
                hwloc_bitmap_set(t.opt, static_cast<unsigned>(first_pu));
                if (o.smt == ZB_SMT_TRAIN) {
                    Bitmap siblings(c.pus);
                    hwloc_bitmap_clr(siblings, static_cast<unsigned>(first_pu));
                    hwloc_bitmap_or(t.train, t.train, siblings);
                }
            }
        } else if (is_train[i]) {
            hwloc_bitmap_or(t.train, t.train, c.pus);
        }
    }
    t.train_threads = trained;
    t.opt_threads = static_cast<unsigned>(hwloc_bitmap_weight(t.opt));
    hwloc_bitmap_or(t.cpus, t.train, t.opt);
    return t;
}

// Rule 6: which share each task takes (in order without GPUs).
std::vector<size_t> deal_shares(hwloc_topology_t topo, const Machine &m,
                                const std::vector<size_t> &sizes, const int *gpu_nodes,
                                Warnings &warn) {
    std::vector<size_t> order(sizes.size());
    for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
    if (!gpu_nodes) return order;
    std::vector<zb::ShareNodes> shares(sizes.size());
    Bitmap step_nodes;
    for (size_t s = 0, first = 0; s < sizes.size(); first += sizes[s++]) {
        std::vector<unsigned> per_node(m.node_os.size(), 0);
        for (size_t i = first; i < first + sizes[s]; ++i)
            ++per_node[static_cast<size_t>(m.seq[i].node)];
        for (size_t k = 0; k < per_node.size(); ++k)
            if (per_node[k]) shares[s].emplace_back(m.node_os[k], per_node[k]);
    }
    for (const Core &c : m.seq)
        hwloc_bitmap_set(step_nodes, m.node_os[static_cast<size_t>(c.node)]);
    zb::GpuPlacement p = zb::place_by_gpu(topo, shares, step_nodes, gpu_nodes);
    for (auto &[task, text] : p.warnings)
        warn.add(task, text);
    return p.share_of;
}

std::unique_ptr<zb_plan> compute(const zb_topology_t *topology, hwloc_const_cpuset_t allowed,
                                 unsigned ntasks, const zb_options &o, const int *gpu_nodes) {
    hwloc_topology_t topo = topology->topo;
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(topo);
    if (ntasks == 0) zb::fail(ZB_EINVAL, "the task count must be at least 1");
    if (hwloc_bitmap_iszero(allowed)) zb::fail(ZB_EINVAL, "the allowed CPU set is empty");
    if (!hwloc_bitmap_isincluded(allowed, all)) {
        Bitmap outside;
        hwloc_bitmap_andnot(outside, allowed, all);
        if (hwloc_bitmap_weight(outside) < 0)
            zb::fail(ZB_EINVAL, "the allowed CPU set is infinite");
        zb::fail(ZB_EINVAL,
                 "CPUs " + list(outside) + " are not in the topology (" + list(all) + ")");
    }
    const Machine m = build_machine(topo, allowed, o.numa);
    const size_t ncores = m.seq.size();
    auto plan = std::make_unique<zb_plan>();
    Warnings warn;
    if (gpu_nodes) plan->gpu_nodes.assign(gpu_nodes, gpu_nodes + ntasks);
    if (o.gpu == ZB_GPU_IGNORE) gpu_nodes = nullptr;
    if (gpu_nodes && ntasks > ncores)
        warn.add_global("tasks share cores round-robin, so they are not placed by their GPUs");
    if (o.mode == ZB_MODE_OFFLOAD &&
        (o.train_cores || o.train_fraction > 0 || o.opt_cores || o.profile[0]))
        warn.add_global("mode=offload gives each task its whole share: train=, opt= and profile= "
                        "do not apply");

    if (ntasks > ncores) {
        warn.add_global(std::to_string(ntasks) + " tasks but only " + std::to_string(ncores) +
                        (ncores == 1 ? " core" : " cores") +
                        ": tasks share whole cores round-robin (task i gets core i mod " +
                        std::to_string(ncores) + ")" +
                        (o.mode == ZB_MODE_OFFLOAD
                             ? ""
                             : ", and each task's training and optimizer share its core"));
        for (unsigned i = 0; i < ntasks; ++i)
            plan->tasks.push_back(o.mode == ZB_MODE_OFFLOAD
                                      ? offload_task(m, m.seq.begin() + i % ncores, 1)
                                      : shared_core_task(m, m.seq[i % ncores]));
    } else {
        const std::vector<size_t> sizes = share_sizes(m.seq, ntasks);
        std::vector<size_t> firsts(ntasks, 0);
        for (unsigned i = 1; i < ntasks; ++i)
            firsts[i] = firsts[i - 1] + sizes[i - 1];
        const std::vector<size_t> share = deal_shares(topo, m, sizes, gpu_nodes, warn);
        for (unsigned i = 0; i < ntasks; ++i)
            plan->tasks.push_back(make_task(m, firsts[share[i]], sizes[share[i]], o, i, warn));
    }
    for (unsigned i = 0; i < ntasks; ++i) {
        const zb_plan::Task &t = plan->tasks[i];
        if (o.numa == ZB_NUMA_STRICT && hwloc_bitmap_weight(t.nodes) > 1)
            zb::fail(ZB_EIMPOSSIBLE,
                     "numa=strict: task " + std::to_string(i) + " would span NUMA nodes " +
                         list(t.nodes) + " (" + std::to_string(ncores) + " cores for " +
                         std::to_string(ntasks) + " tasks on CPUs " + list(allowed) + ")");
    }
    plan->warnings = warn.take();
    return plan;
}

} // namespace

extern "C" {

zb_status zb_plan_compute(const zb_topology_t *topology, const zb_cpuset_t *allowed,
                          unsigned ntasks, const zb_options *options, const int *gpu_nodes,
                          unsigned long flags, zb_plan_t **out) {
    return zb::guard([&] {
        if (!topology || !allowed || !out) zb::fail(ZB_EINVAL, "zb_plan_compute: NULL argument");
        zb::check_flags(flags, 0, "zb_plan_compute");
        zb_options defaults;
        if (!options) {
            zb_options_init(&defaults);
            options = &defaults;
        }
        zb::check_size(options->size, sizeof *options, "zb_plan_compute", "options",
                       "zb_options_init");
        *out = compute(topology, zb_cpuset_hwloc_const(allowed), ntasks, *options, gpu_nodes)
                   .release();
    });
}

int zb_plan_task_gpu_node(const zb_plan_t *plan, unsigned index) {
    return plan && index < plan->gpu_nodes.size() ? plan->gpu_nodes[index] : -1;
}

void zb_plan_free(zb_plan_t *plan) {
    delete plan;
}

unsigned zb_plan_ntasks(const zb_plan_t *plan) {
    return plan ? static_cast<unsigned>(plan->tasks.size()) : 0;
}

zb_status zb_plan_task(const zb_plan_t *plan, unsigned index, zb_task_plan *out) {
    return zb::guard([&] {
        if (!plan || !out) zb::fail(ZB_EINVAL, "zb_plan_task: NULL argument");
        if (index >= plan->tasks.size())
            zb::fail(ZB_EINVAL, "task " + std::to_string(index) + " is not in the plan (" +
                                    std::to_string(plan->tasks.size()) + " tasks)");
        const zb_plan::Task &t = plan->tasks[index];
        *out = {zb_cpuset_from_hwloc_const(t.cpus),
                zb_cpuset_from_hwloc_const(t.train),
                zb_cpuset_from_hwloc_const(t.opt),
                zb_cpuset_from_hwloc_const(t.nodes),
                zb_cpuset_from_hwloc_const(t.mems),
                t.train_threads,
                t.opt_threads,
                t.cores};
    });
}

unsigned zb_plan_nwarnings(const zb_plan_t *plan) {
    return plan ? static_cast<unsigned>(plan->warnings.size()) : 0;
}

const char *zb_plan_warning(const zb_plan_t *plan, unsigned index) {
    if (!plan || index >= plan->warnings.size()) return nullptr;
    return plan->warnings[index].c_str();
}
}
