// Which source holds a Slurm step's CPUs, decided from the task's own cgroup (/proc/self/cgroup)
// and what libzenbind found for its cpuset: pure, so every case and every cgroup layout is tested
// without Slurm or cgroups (test_step_source).
#pragma once

#include <zenbind/zenbind.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace zb::spank {

enum class StepSource {
    step_cgroup,       // the cgroup read is the step's own (.../step_S/, or its user/ on v2)
    step_cgroup_above, // it is a task_T cgroup inside the step: read the step's, one level up
    alloc_cores,       // no cgroup confines the step: what Slurm says it owns
    failed,            // the cgroup could not be read: report it, never guess
};

// The task's cgroup in the hierarchy that holds its cpuset, from the text of /proc/self/cgroup:
// the v1 line that lists cpuset, else the v2 ("0::") line, as zb_cgroup_cpuset() chooses. Empty
// when there is neither.
std::string task_cgroup(std::string_view proc_self_cgroup);

// `status` and `file` from zb_cgroup_cpuset(), `cgroup` from task_cgroup(). The step's cgroup is
// the level of the task's own cgroup named for the step (step_3, step_batch, ...) with only
// Slurm's task levels below it (task_T, under user/ on v2). The job's level above it may have any
// name: job_<id> up to Slurm 24.11, the job's SLUID on 26.05 unless CgroupJobIdPaths=yes.
// ZB_ENOENT (no cpuset controller), a task outside any step cgroup (task/affinity alone) and a
// file above the step's level (cgroup v2 without ConstrainCores) all mean that no cgroup confines
// the step; any other error is a failure, not an absence.
StepSource step_source(zb_status status, const std::string &file, std::string_view cgroup,
                       uint32_t step_id);

} // namespace zb::spank
