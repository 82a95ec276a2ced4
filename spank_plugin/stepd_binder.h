// The interface between zenflow_bind.so, which every srun, sbatch, salloc and slurmstepd on the
// cluster loads, and zenflow_bind_binder.so, which slurmstepd loads (dlopen) only for a step that
// binds: topology, cgroups, the planner, affinity and environment, with libzenbind and hwloc.
// Jobs that do not ask for binding load neither library.
#pragma once

#include "spank_api.hpp"

#include <zenbind/zenbind.h>

// Bumped whenever the table below or a struct it passes (zb_options) changes: a plugin refuses a
// binder of another version. 3: zb_options starts with its size (libzenbind.so.2).
#define ZB_BINDER_ABI 3

extern "C" {

struct zb_binder {
    unsigned abi;
    // slurmstepd's user_init of a step that binds: topology and profile, once per step. A problem
    // is kept and reported by each task, as the options' onerror= says.
    void (*step_init)(spank_t sp, const zb_options *options);
    // Each task: plan, environment, affinity. 0, or -1 to fail the task.
    int (*task_init)(spank_t sp, const zb_options *options);
    void (*step_exit)(void);
};

// The binder's only exported symbol.
const struct zb_binder *zb_binder_get(void);
}
