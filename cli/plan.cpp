// `zenbind plan`: what every local task would get, for any topology, allowed set and options.
#include "commands.hpp"
#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace cli {
namespace {

struct PlanArgs {
    unsigned tasks = 0;
    std::string synthetic, topology_file, cpuset, options;
    bool has_cpuset = false, json = false;
};

int parse(int argc, char **argv, PlanArgs &a) {
    for (int i = 0; i < argc; ++i) {
        const std::string arg = argv[i];
        std::string value;
        if (arg == "--json") {
            a.json = true;
        } else if (arg == "--tasks" || arg == "--synthetic" || arg == "--topology" ||
                   arg == "--cpuset" || arg == "--options") {
            if (!take_value(argc, argv, i, value)) return error(kUsage, arg + " needs a value");
            if (arg == "--tasks") {
                char *end = nullptr;
                const unsigned long n = std::strtoul(value.c_str(), &end, 10);
                if (value.empty() || *end || value[0] == '-' || n < 1 || n > 65536)
                    return error(kUsage,
                                 "--tasks takes a number from 1 to 65536, not '" + value + "'");
                a.tasks = static_cast<unsigned>(n);
            } else if (arg == "--synthetic") {
                a.synthetic = value;
            } else if (arg == "--topology") {
                a.topology_file = value;
            } else if (arg == "--cpuset") {
                a.cpuset = value;
                a.has_cpuset = true;
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
    return kOk;
}

struct Owned {
    zb_topology_t *topology = nullptr;
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    zb_profile_t *profile = nullptr;
    zb_plan_t *plan = nullptr;
    ~Owned() {
        zb_plan_free(plan);
        zb_profile_free(profile);
        hwloc_bitmap_free(allowed);
        zb_topology_free(topology);
    }
};

void print_json(const Owned &o) {
    std::printf("{\"allowed\": %s, \"tasks\": [", json_string(cpulist(o.allowed)).c_str());
    for (unsigned i = 0; i < zb_plan_ntasks(o.plan); ++i) {
        zb_task_plan t;
        zb_plan_task(o.plan, i, &t);
        std::printf("%s{\"task\": %u, \"train_cpus\": %s, \"opt_cpus\": %s, \"train_threads\": %u, "
                    "\"opt_threads\": %u, \"opt_mems\": %s, \"nodes\": %s, \"cores\": %u, "
                    "\"cpus\": %s}",
                    i ? ", " : "", i, json_string(cpulist(t.train_cpus)).c_str(),
                    json_string(cpulist(t.opt_cpus)).c_str(), t.train_threads, t.opt_threads,
                    json_string(cpulist(t.opt_mems)).c_str(), json_string(cpulist(t.nodes)).c_str(),
                    t.cores, json_string(cpulist(t.cpus)).c_str());
    }
    std::printf("], \"warnings\": [");
    for (unsigned i = 0; i < zb_plan_nwarnings(o.plan); ++i)
        std::printf("%s%s", i ? ", " : "", json_string(zb_plan_warning(o.plan, i)).c_str());
    std::printf("]}\n");
}

void print_table(const Owned &o, const std::string &source) {
    std::printf("allowed CPUs %s (%s)\n\n", cpulist(o.allowed).c_str(), source.c_str());
    const std::vector<std::string> head = {"task",           "cores",   "training CPUs", "threads",
                                           "optimizer CPUs", "threads", "opt memory",    "NUMA"};
    std::vector<std::vector<std::string>> rows = {head};
    for (unsigned i = 0; i < zb_plan_ntasks(o.plan); ++i) {
        zb_task_plan t;
        zb_plan_task(o.plan, i, &t);
        rows.push_back({std::to_string(i), std::to_string(t.cores), cpulist(t.train_cpus),
                        std::to_string(t.train_threads), cpulist(t.opt_cpus),
                        std::to_string(t.opt_threads), cpulist(t.opt_mems), cpulist(t.nodes)});
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
    for (unsigned i = 0; i < zb_plan_nwarnings(o.plan); ++i)
        std::printf("%swarning: %s\n", i ? "" : "\n", zb_plan_warning(o.plan, i));
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
        if (zb_allowed_cpus(nullptr, 0, o.allowed, file, sizeof file) != ZB_OK)
            return zb_error(kRuntime, "cannot read this process's allowed CPUs");
        source = std::string("this process: ") + file + " and its affinity";
    } else {
        hwloc_bitmap_copy(o.allowed, zb_topology_cpuset(o.topology));
        source = "every CPU of the topology";
    }

    zb_options options;
    zb_options_init(&options);
    if (zb_options_parse(&options, a.options.c_str(), ZB_SCOPE_USER) != ZB_OK)
        return zb_error(kUsage, "--options");
    if (options.profile[0] && options.mode != ZB_MODE_OFFLOAD) {
        if (zb_profile_load(options.profile, &o.profile) != ZB_OK ||
            zb_profile_apply(o.profile, o.topology, o.allowed, a.tasks, &options) != ZB_OK)
            return zb_error(kRuntime, "profile");
    }
    if (zb_plan_compute(o.topology, o.allowed, a.tasks, &options, &o.plan) != ZB_OK)
        return zb_error(kRuntime, "no plan");
    if (a.json)
        print_json(o);
    else
        print_table(o, source);
    return kOk;
}

} // namespace cli
