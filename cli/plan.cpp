// `zenbind plan`: what every local task would get, for any topology, allowed set and options.
#include "commands.hpp"
#include "common.hpp"
#include "picture.hpp"

#include <zbutil/decimal.hpp>
#include <zenbind/hwloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace zb::cli {
namespace {

struct PlanArgs {
    unsigned tasks = 0;
    std::string synthetic, topology_file, cpuset, options, picture;
    std::string gpu_nodes, gpus, gpu_root, gpumap;
    bool has_cpuset = false, json = false;
};

const std::vector<std::string> kValueFlags = {
    "--tasks",   "--synthetic", "--topology", "--cpuset",   "--options",
    "--picture", "--gpu-nodes", "--gpus",     "--gpu-root", "--gpumap"};

int parse(int argc, char **argv, PlanArgs &a) {
    std::vector<std::string> seen;
    for (int i = 0; i < argc; ++i) {
        const std::string arg = argv[i];
        std::string value;
        if (arg == "--json") {
            a.json = true;
        } else if (std::find(kValueFlags.begin(), kValueFlags.end(), arg) != kValueFlags.end()) {
            if (!take_value(argc, argv, i, value)) return error(kUsage, arg + " needs a value");
            // A second value would silently replace the first (a second --options dropping the
            // keys of the first); an empty one would silently mean "not given" (--synthetic ""
            // planning this machine).
            if (std::find(seen.begin(), seen.end(), arg) != seen.end())
                return error(kUsage,
                             "plan: " + arg + " is given twice" +
                                 (arg == "--options" ? " (join the keys with commas)" : ""));
            seen.push_back(arg);
            if (value.empty() && arg != "--options")
                return error(kUsage, "plan: " + arg + " needs a value, not an empty string");
            if (arg == "--tasks") {
                const auto n = zb::util::parse_decimal(value, 65536);
                if (!n || *n < 1)
                    return error(kUsage,
                                 "--tasks takes a number from 1 to 65536, not '" + value + "'");
                a.tasks = static_cast<unsigned>(*n);
            } else if (arg == "--synthetic") {
                a.synthetic = value;
            } else if (arg == "--topology") {
                a.topology_file = value;
            } else if (arg == "--cpuset") {
                a.cpuset = value;
                a.has_cpuset = true;
            } else if (arg == "--picture") {
                if (!picture_format(value))
                    return error(kUsage,
                                 "--picture " + value + ": the name must be NAME.svg or NAME.png");
                a.picture = value;
            } else if (arg == "--gpu-nodes") {
                a.gpu_nodes = value;
            } else if (arg == "--gpus") {
                a.gpus = value;
            } else if (arg == "--gpu-root") {
                a.gpu_root = value;
            } else if (arg == "--gpumap") {
                a.gpumap = value;
            } else {
                a.options = value;
            }
        } else {
            return error(kUsage, "plan: unknown argument '" + arg + "' (see zenbind help plan)");
        }
    }
    if (!a.tasks) return error(kUsage, "plan: --tasks N is required");
    if (!a.synthetic.empty() && !a.topology_file.empty())
        return error(kUsage, "plan: give --synthetic or --topology, not both");
    if (!a.gpu_nodes.empty() && !a.gpus.empty())
        return error(kUsage, "plan: give --gpu-nodes or --gpus, not both");
    if ((!a.gpu_root.empty() || !a.gpumap.empty()) && a.gpus.empty())
        return error(kUsage, "plan: --gpu-root and --gpumap resolve --gpus, which is missing");
    if (!a.gpu_root.empty() && !a.gpumap.empty())
        return error(kUsage, "plan: give --gpu-root or --gpumap, not both");
    return kOk;
}

// Each task's GPU (index, or -1 when only its node is known) and the GPU's NUMA node (-1: none).
struct TaskGpus {
    std::vector<int> index, node;
};

// --gpu-nodes: one NUMA node per task, "-" for a task without a GPU.
int parse_gpu_nodes(const std::string &text, unsigned ntasks, TaskGpus &out) {
    size_t begin = 0;
    for (;;) {
        const size_t comma = text.find(',', begin);
        const std::string item =
            text.substr(begin, comma == std::string::npos ? comma : comma - begin);
        const auto node = zb::util::parse_decimal(item, ZB_CPULIST_MAX_ID);
        if (item == "-")
            out.node.push_back(-1);
        else if (node)
            out.node.push_back(static_cast<int>(*node));
        else
            return error(kUsage, "--gpu-nodes: '" + item +
                                     "' is neither a NUMA node number nor '-' (no GPU)");
        if (comma == std::string::npos) break;
        begin = comma + 1;
    }
    if (out.node.size() != ntasks)
        return error(kUsage, "--gpu-nodes lists " + std::to_string(out.node.size()) +
                                 " tasks, --tasks says " + std::to_string(ntasks));
    out.index.assign(ntasks, -1);
    return kOk;
}

// --gpus: the step's GPU list, given to each task as the plugin does, and resolved to NUMA nodes
// on this machine (or --gpu-root, --gpumap).
int resolve_gpus(const PlanArgs &a, TaskGpus &out, std::vector<std::string> &notes) {
    std::vector<unsigned> index(a.tasks);
    if (zb_gpus_assign(a.gpus.c_str(), a.tasks, index.data()) != ZB_OK)
        return zb_error(kUsage, "--gpus");
    zb_gpus_t *gpus = nullptr;
    if (zb_gpus_load(a.gpu_root.empty() ? nullptr : a.gpu_root.c_str(),
                     a.gpumap.empty() ? nullptr : a.gpumap.c_str(), &gpus) != ZB_OK)
        return zb_error(kRuntime, "cannot find the GPUs of --gpus");
    for (unsigned i = 0; i < a.tasks; ++i) {
        zb_gpu gpu;
        out.index.push_back(static_cast<int>(index[i]));
        out.node.push_back(-1);
        if (zb_gpus_find(gpus, index[i], &gpu) != ZB_OK)
            notes.push_back("task " + std::to_string(i) + ": " + zb_last_error());
        else if (gpu.numa_node < 0)
            notes.push_back("task " + std::to_string(i) + ": GPU " + std::to_string(index[i]) +
                            " has no known NUMA node");
        else
            out.node.back() = gpu.numa_node;
    }
    zb_gpus_free(gpus);
    return kOk;
}

std::string gpu_text(const TaskGpus &g, unsigned i) {
    if (g.node.empty()) return "";
    const std::string node = g.node[i] < 0 ? "?" : std::to_string(g.node[i]);
    if (g.index[i] < 0) return g.node[i] < 0 ? "-" : "node " + node;
    return std::to_string(g.index[i]) + " (node " + node + ")";
}

std::string json_int(int value) {
    return value < 0 ? "null" : std::to_string(value);
}

struct Owned {
    zb_topology_t *topology = nullptr;
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    zb_profile_t *profile = nullptr;
    zb_plan_t *plan = nullptr;
    ~Owned() {
        zb_plan_free(plan);
        zb_profile_free(profile);
        zb_cpuset_free(allowed);
        zb_topology_free(topology);
    }
};

// The CLI's own warnings, then the plan's.
std::vector<std::string> all_warnings(const Owned &o, std::vector<std::string> warnings) {
    for (unsigned i = 0; i < zb_plan_nwarnings(o.plan); ++i)
        warnings.emplace_back(zb_plan_warning(o.plan, i));
    return warnings;
}

void print_json(const Owned &o, const TaskGpus &g, const std::vector<std::string> &warnings) {
    std::printf("{\"allowed\": %s, \"tasks\": [", json_string(cpulist(o.allowed)).c_str());
    for (unsigned i = 0; i < zb_plan_ntasks(o.plan); ++i) {
        zb_task_plan t;
        zb_plan_task(o.plan, i, &t);
        std::printf("%s{\"task\": %u, \"train_cpus\": %s, \"opt_cpus\": %s, \"train_threads\": %u, "
                    "\"opt_threads\": %u, \"opt_mems\": %s, \"nodes\": %s, \"cores\": %u, "
                    "\"cpus\": %s, \"gpu\": %s, \"gpu_node\": %s}",
                    i ? ", " : "", i, json_string(cpulist(t.train_cpus)).c_str(),
                    json_string(cpulist(t.opt_cpus)).c_str(), t.train_threads, t.opt_threads,
                    json_string(cpulist(t.opt_mems)).c_str(), json_string(cpulist(t.nodes)).c_str(),
                    t.cores, json_string(cpulist(t.cpus)).c_str(),
                    json_int(g.index.empty() ? -1 : g.index[i]).c_str(),
                    json_int(zb_plan_task_gpu_node(o.plan, i)).c_str());
    }
    std::printf("], \"warnings\": [");
    for (size_t i = 0; i < warnings.size(); ++i)
        std::printf("%s%s", i ? ", " : "", json_string(warnings[i]).c_str());
    std::printf("]}\n");
}

void print_table(const Owned &o, const std::string &source, const TaskGpus &g,
                 const std::vector<std::string> &warnings) {
    std::printf("allowed CPUs %s (%s)\n\n", cpulist(o.allowed).c_str(), source.c_str());
    std::vector<std::string> head = {"task",           "cores",   "training CPUs", "threads",
                                     "optimizer CPUs", "threads", "opt memory",    "NUMA"};
    if (!g.node.empty()) head.push_back("GPU");
    std::vector<std::vector<std::string>> rows = {head};
    for (unsigned i = 0; i < zb_plan_ntasks(o.plan); ++i) {
        zb_task_plan t;
        zb_plan_task(o.plan, i, &t);
        rows.push_back({std::to_string(i), std::to_string(t.cores), cpulist(t.train_cpus),
                        std::to_string(t.train_threads), cpulist(t.opt_cpus),
                        std::to_string(t.opt_threads), cpulist(t.opt_mems), cpulist(t.nodes)});
        if (!g.node.empty()) rows.back().push_back(gpu_text(g, i));
    }
    std::vector<size_t> width(head.size(), 0);
    for (const auto &r : rows)
        for (size_t c = 0; c < r.size(); ++c)
            width[c] = std::max(width[c], r[c].size());
    for (const auto &r : rows) {
        for (size_t c = 0; c + 1 < r.size(); ++c)
            std::printf("%-*s  ", static_cast<int>(width[c]), r[c].c_str());
        std::printf("%s\n", r.back().c_str());
    }
    for (size_t i = 0; i < warnings.size(); ++i)
        std::printf("%swarning: %s\n", i ? "" : "\n", warnings[i].c_str());
}

} // namespace

int cmd_plan(int argc, char **argv) {
    PlanArgs a;
    if (int rc = parse(argc, argv, a)) return rc;
    Owned o;
    std::string source;
    zb_status st = ZB_OK;
    if (!a.synthetic.empty())
        st = zb_topology_load_synthetic(a.synthetic.c_str(), &o.topology);
    else if (!a.topology_file.empty())
        st = zb_topology_load_xml(a.topology_file.c_str(), &o.topology);
    else
        st = zb_topology_load(&o.topology);
    if (st != ZB_OK) return zb_error(kRuntime, "cannot load the topology");

    if (a.has_cpuset) {
        if (zb_cpulist_parse(a.cpuset.c_str(), o.allowed) != ZB_OK)
            return zb_error(kUsage, "--cpuset");
        source = "--cpuset";
    } else if (a.synthetic.empty() && a.topology_file.empty()) {
        char file[4096];
        if (const int rc = this_process_cpus(o.allowed, file, sizeof file)) return rc;
        source = std::string("this process: ") + file + " and its affinity";
    } else {
        hwloc_bitmap_copy(zb_cpuset_hwloc(o.allowed),
                          zb_cpuset_hwloc_const(zb_topology_cpuset(o.topology)));
        source = "every CPU of the topology";
    }

    zb_options options;
    zb_options_init(&options);
    if (zb_options_parse(&options, a.options.c_str(), ZB_SCOPE_USER) != ZB_OK)
        return zb_error(kUsage, "--options");
    std::vector<std::string> warnings;
    if ((options.set & ZB_SET_ENABLED) && !options.enabled)
        warnings.emplace_back("off: the plugin would leave such a step as Slurm bound it, with no "
                              "ZENFLOW_* variables; this is the plan it would make with on");
    if (options.profile[0] && options.mode != ZB_MODE_OFFLOAD) {
        if (zb_profile_load(options.profile, &o.profile) != ZB_OK ||
            zb_profile_apply(o.profile, o.topology, o.allowed, a.tasks, &options) != ZB_OK)
            return zb_error(kRuntime, "profile");
    }
    TaskGpus gpus;
    std::vector<std::string> notes;
    if (!a.gpu_nodes.empty()) {
        if (int rc = parse_gpu_nodes(a.gpu_nodes, a.tasks, gpus)) return rc;
    } else if (!a.gpus.empty()) {
        if (int rc = resolve_gpus(a, gpus, notes)) return rc;
    }
    if (zb_plan_compute(o.topology, o.allowed, a.tasks, &options,
                        gpus.node.empty() ? nullptr : gpus.node.data(), 0, &o.plan) != ZB_OK)
        return zb_error(kRuntime, "no plan");
    for (const std::string &note : notes)
        std::fprintf(stderr, "zenbind: warning: %s: share taken in order\n", note.c_str());
    // The picture first: a failed command prints no plan that a script could take for its result.
    std::string why;
    if (!a.picture.empty() && !draw_plan(o.topology, o.plan, a.picture, why))
        return error(kRuntime, "plan: " + why);
    warnings = all_warnings(o, std::move(warnings));
    if (a.json)
        print_json(o, gpus, warnings);
    else
        print_table(o, source, gpus, warnings);
    if (!a.picture.empty() && !a.json) std::printf("\npicture written to %s\n", a.picture.c_str());
    return kOk;
}

} // namespace zb::cli
