// Which task takes which share when tasks drive GPUs (zb_plan_compute with gpu_nodes): the shares
// are the planner's, only their order among the tasks changes, so the CPUs used stay the same.
#pragma once

#include <hwloc.h>

#include <string>
#include <utility>
#include <vector>

namespace zb {

struct GpuPlacement {
    std::vector<size_t> share_of;                           // share index of each task
    std::vector<std::pair<unsigned, std::string>> warnings; // (task, sentence)
};

// How many cores a share has on each NUMA node (OS number) it touches.
using ShareNodes = std::vector<std::pair<unsigned, unsigned>>;

// `shares[s]`: share s's nodes; `step_nodes`: the nodes with CPUs of the step; `gpu_nodes[t]`:
// task t's GPU node, -1 for none (a memory-only node, such as a Grace Hopper GPU's own HBM,
// stands for the nearest DRAM node with CPUs, silently: that is where the GPU's CPUs are). First,
// in task order, each GPU task whose node holds cores of a free share takes the free share with
// most cores there; then each remaining GPU task takes the free share nearest its GPU (hwloc's NUMA
// distances, else the topology tree; more cores on the nearest node first); ties go to the first
// share. Tasks without a GPU take what is left, in order.
GpuPlacement place_by_gpu(hwloc_topology_t topo, const std::vector<ShareNodes> &shares,
                          hwloc_const_nodeset_t step_nodes, const int *gpu_nodes);

} // namespace zb
