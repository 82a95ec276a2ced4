// The zb_topology_t handle: an hwloc topology that always includes the CPUs this process may not
// use, because the allowed set is an input of its own (a Slurm step's cgroup, --cpuset); and what
// the planner asks of its NUMA nodes.
#pragma once

#include <zenbind/hwloc.h>

#include <cstring>
#include <vector>

struct zb_topology {
    hwloc_topology_t topo = nullptr;
    ~zb_topology() {
        if (topo) hwloc_topology_destroy(topo);
    }
};

namespace zb {

// Whether a NUMA node is ordinary memory, the home of the CPUs near it (no subtype, or "DRAM"),
// rather than memory only: HBM, CXL, NVM, a Grace Hopper GPU's HBM ("GPUMemory"). hwloc gives
// memory-only nodes the locality of the CPUs near them too.
inline bool is_dram(hwloc_obj_t node) {
    return !node->subtype || std::strcmp(node->subtype, "DRAM") == 0;
}

// The home node of CPUs `pus` (an index into `nodes`, NUMA nodes in topology order): the first
// whose locality holds one of them, DRAM nodes before memory-only ones; -1 if none does. Tasks are
// placed on home nodes only (the planner), and a profile's saturation is shared on them.
inline int home_node(const std::vector<hwloc_obj_t> &nodes, hwloc_const_cpuset_t pus) {
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < nodes.size(); ++i)
            if ((pass == 1 || is_dram(nodes[i])) && hwloc_bitmap_intersects(nodes[i]->cpuset, pus))
                return static_cast<int>(i);
    return -1;
}

// The NUMA nodes that hold CPUs, in topology order.
inline std::vector<hwloc_obj_t> cpu_nodes(hwloc_topology_t topo) {
    std::vector<hwloc_obj_t> nodes;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n))
        if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset)) nodes.push_back(n);
    return nodes;
}

} // namespace zb
