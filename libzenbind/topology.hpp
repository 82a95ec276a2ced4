// The zb_topology_t handle: an hwloc topology that always includes the CPUs this process may not
// use, because the allowed set is an input of its own (a Slurm step's cgroup, --cpuset).
#pragma once

#include <zenbind/hwloc.h>

struct zb_topology {
    hwloc_topology_t topo = nullptr;
    ~zb_topology() {
        if (topo) hwloc_topology_destroy(topo);
    }
};
