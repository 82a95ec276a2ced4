// The CPUs of the cores Slurm allocated to a step on this node (S_STEP_ALLOC_CORES), for when no
// cpuset cgroup confines the step. Pure: no Slurm calls, so it is unit-tested on any topology.
#pragma once

#include <zenbind/zenbind.h>

#include <string>

namespace zb::spank {

// `cores` is Slurm's list of the node's core ids (for example "0-3,16"); `out` receives every PU
// of those cores. False, with `error` naming the problem, for a bad list or a core this node lacks.
bool alloc_cores_to_cpus(const char *cores, const zb_topology_t *topology, zb_cpuset_t *out,
                         std::string &error);

} // namespace zb::spank
