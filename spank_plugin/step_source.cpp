#include "step_source.hpp"

#include "slurm_api.hpp"

namespace zbspank {
namespace {

std::string step_dir_name(uint32_t step_id) {
    switch (step_id) {
    case SLURM_BATCH_SCRIPT:
        return "step_batch";
    case SLURM_EXTERN_CONT:
        return "step_extern";
    case SLURM_INTERACTIVE_STEP:
        return "step_interactive";
    default:
        return "step_" + std::to_string(step_id);
    }
}

} // namespace

StepSource step_source(zb_status status, const std::string &file, uint32_t job_id,
                       uint32_t step_id) {
    if (status == ZB_ENOENT) return StepSource::alloc_cores;
    if (status != ZB_OK) return StepSource::failed;
    const std::string step = "/job_" + std::to_string(job_id) + "/" + step_dir_name(step_id) + "/";
    if (file.find(step) == std::string::npos) return StepSource::alloc_cores;
    const std::string dir = file.substr(0, file.rfind('/'));
    return dir.compare(dir.rfind('/') + 1, 5, "task_") == 0 ? StepSource::step_cgroup_above
                                                            : StepSource::step_cgroup;
}

} // namespace zbspank
