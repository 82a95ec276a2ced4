// What the plugin does when the user also gave srun --cpu-bind (or sbatch --cpu-bind, or an
// exported SLURM_CPU_BIND). srun then sets SLURM_CPU_BIND and SLURM_CPU_BIND_TYPE in its own
// environment, before any task starts, and passes them to the step: the decision is taken in
// srun, which says it, and again in slurmstepd, which carries it out (a _TYPE without
// SLURM_CPU_BIND is another task's, inherited). Pure: tested without Slurm.
#pragma once

#include <string>

namespace zb::spank {

enum class CpuBindAction {
    none,   // no --cpu-bind type given (or only verbose/quiet): nothing to decide
    refine, // a granularity (cores, threads, sockets, ldoms, boards): zenflow-bind binds whole
            // cores inside each task's share, a finer choice of the same kind; bind, and say so
    refuse, // the user chose CPUs or no binding (map_*, mask_*, rank*, none) and asked for
            // --zenflow-bind too: the two contradict, every task fails before running anything
    defer,  // the same, but binding is on only by the admin's default=on: the user's explicit
            // --cpu-bind wins and this step is left to Slurm
};

struct CpuBindDecision {
    CpuBindAction action = CpuBindAction::none;
    std::string message; // for the user, without a prefix; empty for none
};

// `type` and `list` are SLURM_CPU_BIND_TYPE and SLURM_CPU_BIND_LIST as srun sets them (nullptr
// when unset; "map_cpu:" and "0,2"), `asked` whether the user gave --zenflow-bind for this step
// (as opposed to the admin's default=on).
CpuBindDecision decide_cpu_bind(const char *type, const char *list, bool asked);

} // namespace zb::spank
