// Which source holds a Slurm step's CPUs, decided from what libzenbind found for this process's
// cpuset: pure, so every case is tested without Slurm or cgroups (test_step_source).
#pragma once

#include <zenbind/zenbind.h>

#include <cstdint>
#include <string>

namespace zbspank {

enum class StepSource {
    step_cgroup,       // the cgroup read is the step's own (.../job_J/step_S/...)
    step_cgroup_above, // it is a task_T cgroup inside the step: read the step's, one level up
    alloc_cores,       // no cgroup confines the step: what Slurm says it owns
    failed,            // the cgroup could not be read: report it, never guess
};

// `status` and `file` from zb_cgroup_cpuset(): ZB_ENOENT (no cpuset controller) and a file that
// is not the step's (task/affinity alone, cgroup v2 without ConstrainCores) both mean that no
// cgroup confines the step; any other error is a failure, not an absence.
StepSource step_source(zb_status status, const std::string &file, uint32_t job_id,
                       uint32_t step_id);

} // namespace zbspank
