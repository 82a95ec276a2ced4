// The zb_topology_t handle: an hwloc topology that always includes the CPUs this process may not
// use, because the allowed set is an input of its own (a Slurm step's cgroup, --cpuset); and what
// the planner asks of its NUMA nodes.
#pragma once

#include <zenbind/hwloc.h>

#include <cstring>

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

} // namespace zb
