// The CPUs a Slurm step owns on this node: its cgroup cpuset when Slurm confines the step with
// one (task/cgroup), otherwise the cores Slurm allocated to the step here. Never "all CPUs":
// task/affinity alone leaves the task in a cgroup Slurm did not make for it.
#pragma once

#include "spank_api.hpp"
#include <zenbind/zenbind.h>

#include <cstdint>
#include <string>

namespace zb::spank {

// Fills `out`; `source` says where the set came from (a cgroup file, or S_STEP_ALLOC_CORES).
bool step_cpus(spank_t sp, const zb_topology_t *topology, uint32_t step_id, zb_cpuset_t *out,
               std::string &source, std::string &error);

} // namespace zb::spank
