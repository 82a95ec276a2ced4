// The variables a bound task finds in its environment (zenflow_bind(8), ENVIRONMENT), and their
// removal: compiled into the plugin (steps it leaves alone must not keep another step's plan) and
// into the binder.
#pragma once

#include "spank_api.hpp"

#include <zenbind/zenbind.h>

#include <cstddef>

namespace zb::spank {

// In the order bind_task() sets them; OMP_NUM_THREADS first.
inline constexpr const char *kTaskVariables[] = {
    "OMP_NUM_THREADS", ZB_ENV_TRAIN_THREADS, ZB_ENV_TRAIN_CPUS,
    ZB_ENV_OPT_CPUS,   ZB_ENV_OPT_THREADS,   ZB_ENV_OPT_MEMS,
    ZB_ENV_TASK_CPUS,  ZB_ENV_STEP_CPUS,     ZB_ENV_BIND_OPTIONS};
inline constexpr size_t kTaskVariableCount = sizeof kTaskVariables / sizeof *kTaskVariables;

// The task's OMP_NUM_THREADS before zenflow-bind set it, kept beside a plan (empty where there
// was none) so that a step left unbound inside a bound batch step gets the user's value back.
inline constexpr const char *kUserThreadsVariable = "ZENFLOW_USER_OMP_NUM_THREADS";

// Keeps the OMP_NUM_THREADS a plan is about to replace in kUserThreadsVariable: the one an
// inherited plan kept, while OMP_NUM_THREADS still holds that plan's ZENFLOW_TRAIN_THREADS (a
// step inside a bound batch step), else the current one (a value the user set since included).
void keep_user_threads(spank_t sp);

// Removes every ZENFLOW_* variable of kTaskVariables, and kUserThreadsVariable, from the job's
// environment, inherited ones too (a step inside a bound batch step), so a worker never pins
// itself to another step's plan. Where a plan the plugin made is there and OMP_NUM_THREADS still
// holds its value, OMP_NUM_THREADS goes back to the user's (or away) first.
void clear_env(spank_t sp);

// clear_env() where the environment holds a plan the plugin made (it always exports
// ZENFLOW_BIND_OPTIONS): for steps it does not bind, whose ZENFLOW_* variables a user may have set
// by hand for the worker.
void clear_inherited_plan(spank_t sp);

} // namespace zb::spank
