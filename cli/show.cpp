// `zenbind show`: what this process has: its allowed CPUs, where they came from, and the
// machine's topology by NUMA node.
#include "commands.hpp"
#include "common.hpp"

#include <cstdio>
#include <string>
#include <unistd.h>

namespace cli {

int cmd_show(int argc, char **argv) {
    for (int i = 0; i < argc; ++i)
        return error(kUsage, std::string("show: unknown argument '") + argv[i] + "'");
    zb_topology_t *topology = nullptr;
    if (zb_topology_load(&topology) != ZB_OK) return zb_error(kRuntime, "cannot load the topology");
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    char source[4096];
    if (zb_allowed_cpus(nullptr, 0, allowed, source, sizeof source) != ZB_OK) {
        hwloc_bitmap_free(allowed);
        zb_topology_free(topology);
        return zb_error(kRuntime, "cannot read this process's allowed CPUs");
    }
    hwloc_topology_t topo = zb_topology_hwloc(topology);
    std::printf("allowed CPUs  %s\n", cpulist(allowed).c_str());
    std::printf("  from        %s, intersected with the affinity of pid %d\n", source,
                static_cast<int>(getpid()));
    std::printf("machine CPUs  %s\n\n", cpulist(zb_topology_cpuset(topology)).c_str());
    std::printf("%-5s %-20s %-20s %-6s %-10s %-12s %s\n", "node", "CPUs", "allowed", "cores",
                "PUs/core", "memory", "kind");
    const int core_depth = hwloc_get_type_or_below_depth(topo, HWLOC_OBJ_CORE);
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
        const int cores = hwloc_get_nbobjs_inside_cpuset_by_depth(topo, n->cpuset, core_depth);
        const int pus = hwloc_bitmap_weight(n->cpuset);
        hwloc_bitmap_t mine = hwloc_bitmap_alloc();
        hwloc_bitmap_and(mine, n->cpuset, allowed);
        char memory[32];
        std::snprintf(memory, sizeof memory, "%.1f GiB",
                      static_cast<double>(n->attr->numanode.local_memory) / (1u << 30));
        std::printf("%-5u %-20s %-20s %-6d %-10s %-12s %s\n", n->os_index,
                    cpulist(n->cpuset).c_str(), cpulist(mine).c_str(), cores,
                    cores > 0 ? std::to_string(pus / cores).c_str() : "-", memory,
                    n->subtype ? n->subtype : "DRAM");
        hwloc_bitmap_free(mine);
    }
    hwloc_bitmap_free(allowed);
    zb_topology_free(topology);
    return kOk;
}

} // namespace cli
