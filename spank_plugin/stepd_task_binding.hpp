// One task's binding: plan all local tasks on the step's CPUs, take this task's share, set its
// affinity and the environment the trainer and the optimizer worker read. Runs in the task
// after Slurm bound it (slurm_spank_task_init), before exec.
#pragma once

#include "spank_api.hpp"
#include "spank_env.hpp"
#include "spank_tell.hpp"
#include <zbutil/cpulist_text.hpp>
#include <zenbind/zenbind.h>

#include <cstdint>
#include <string>

namespace zb::spank {

struct TaskInfo {
    unsigned ntasks;    // tasks of the step on this node
    unsigned local_id;  // this task among them
    uint32_t global_id; // its rank in the step
    std::string host;
    std::string step_cpus_source; // for the verbose line
    bool slurm_verbose = false;   // --cpu-bind=verbose: Slurm printed a mask this replaces
};

// The step's GPUs, read once in user_init from the step's environment (before Slurm narrows it
// per task): the list of GPU indexes, the variable it came from, and the node's GPUs to map them
// to NUMA nodes. `problem` says why GPU placement cannot apply when the step has GPUs.
struct StepGpus {
    std::string list, variable;
    zb_gpus_t *gpus = nullptr;
    std::string problem;
};

// Reads the step's GPU list from its environment and loads the node's GPUs (under `fsroot`, or
// from options.gpumap). Never fails: a problem is kept for the tasks to report.
void load_step_gpus(spank_t sp, const zb_options &options, const char *fsroot, StepGpus &out);

// `profile` (may be null) sets the optimizer core count unless the options fix the split; `gpus`
// (may be null) places each task's share by its GPU's NUMA node. On failure `node_wide` says
// whether `error` is the same for every task of the node (the profile, the plan).
bool bind_task(spank_t sp, const zb_topology_t *topology, const zb_profile_t *profile,
               const StepGpus *gpus, const zb_cpuset_t *step_cpus, const zb_options &options,
               const TaskInfo &task, std::string &error, bool &node_wide);

using util::cpulist;

} // namespace zb::spank
