// `zenbind show`: what this process has: its allowed CPUs, where they came from, and the
// machine's topology by NUMA node; a table, or JSON with --json.
#include "commands.hpp"
#include "common.hpp"

#include <zenbind/hwloc.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

namespace zb::cli {
namespace {

struct Node {
    unsigned os_index;
    std::string cpus, allowed, kind;
    int cores, pus_min, pus_max; // hardware threads of its cores: hybrid CPUs mix 1 and 2
    double memory_gib;
};

std::vector<Node> nodes_of(const zb_topology_t *topology, const zb_cpuset_t *allowed) {
    hwloc_topology_t topo = zb_topology_hwloc(topology);
    const int core_depth = hwloc_get_type_or_below_depth(topo, HWLOC_OBJ_CORE);
    std::vector<Node> nodes;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
        const int cores = hwloc_get_nbobjs_inside_cpuset_by_depth(topo, n->cpuset, core_depth);
        int pus_min = 0, pus_max = 0;
        for (hwloc_obj_t c =
                 hwloc_get_next_obj_inside_cpuset_by_depth(topo, n->cpuset, core_depth, nullptr);
             c; c = hwloc_get_next_obj_inside_cpuset_by_depth(topo, n->cpuset, core_depth, c)) {
            const int pus = hwloc_bitmap_weight(c->cpuset);
            pus_min = pus_min ? std::min(pus_min, pus) : pus;
            pus_max = std::max(pus_max, pus);
        }
        hwloc_bitmap_t mine = hwloc_bitmap_alloc();
        hwloc_bitmap_and(mine, n->cpuset, zb_cpuset_hwloc_const(allowed));
        nodes.push_back({n->os_index, cpulist(zb_cpuset_from_hwloc_const(n->cpuset)),
                         cpulist(zb_cpuset_from_hwloc(mine)), n->subtype ? n->subtype : "DRAM",
                         cores, pus_min, pus_max,
                         static_cast<double>(n->attr->numanode.local_memory) / (1u << 30)});
        hwloc_bitmap_free(mine);
    }
    return nodes;
}

void print_table(const std::string &allowed, const char *source, const std::string &machine,
                 const std::vector<Node> &nodes) {
    std::printf("allowed CPUs  %s\n", allowed.c_str());
    std::printf("  from        %s, intersected with the affinity of pid %d\n", source,
                static_cast<int>(getpid()));
    std::printf("machine CPUs  %s\n\n", machine.c_str());
    std::printf("%-5s %-20s %-20s %-6s %-10s %-12s %s\n", "node", "CPUs", "allowed", "cores",
                "PUs/core", "memory", "kind");
    for (const Node &n : nodes) {
        char memory[32];
        std::snprintf(memory, sizeof memory, "%.1f GiB", n.memory_gib);
        std::string pus = std::to_string(n.pus_min);
        if (n.pus_max != n.pus_min) pus += "-" + std::to_string(n.pus_max);
        std::printf("%-5u %-20s %-20s %-6d %-10s %-12s %s\n", n.os_index, n.cpus.c_str(),
                    n.allowed.c_str(), n.cores, n.cores > 0 ? pus.c_str() : "-", memory,
                    n.kind.c_str());
    }
}

void print_json(const std::string &allowed, const char *source, const std::string &machine,
                const std::vector<Node> &nodes) {
    std::printf("{\"allowed\": %s, \"source\": %s, \"machine\": %s, \"nodes\": [",
                json_string(allowed).c_str(), json_string(source).c_str(),
                json_string(machine).c_str());
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Node &n = nodes[i];
        std::printf("%s{\"node\": %u, \"cpus\": %s, \"allowed\": %s, \"cores\": %d, "
                    "\"pus_per_core\": %d, \"memory_gib\": %.3f, \"kind\": %s}",
                    i ? ", " : "", n.os_index, json_string(n.cpus).c_str(),
                    json_string(n.allowed).c_str(), n.cores, n.pus_max, n.memory_gib,
                    json_string(n.kind).c_str());
    }
    std::printf("]}\n");
}

} // namespace

int cmd_show(int argc, char **argv) {
    bool json = false;
    for (int i = 0; i < argc; ++i) {
        if (std::string(argv[i]) == "--json")
            json = true;
        else
            return error(kUsage, std::string("show: unknown argument '") + argv[i] + "'");
    }
    zb_topology_t *topology = nullptr;
    if (zb_topology_load(&topology) != ZB_OK) return zb_error(kRuntime, "cannot load the topology");
    zb_cpuset_t *allowed = zb_cpuset_alloc();
    char source[4096];
    if (const int rc = this_process_cpus(allowed, source, sizeof source)) {
        zb_cpuset_free(allowed);
        zb_topology_free(topology);
        return rc;
    }
    const std::vector<Node> nodes = nodes_of(topology, allowed);
    const std::string mine = cpulist(allowed), machine = cpulist(zb_topology_cpuset(topology));
    if (json)
        print_json(mine, source, machine, nodes);
    else
        print_table(mine, source, machine, nodes);
    zb_cpuset_free(allowed);
    zb_topology_free(topology);
    return kOk;
}

} // namespace zb::cli
