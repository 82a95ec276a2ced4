#include "step_cpus.hpp"

#include "alloc_cores.hpp"

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

bool alloc_cores(spank_t sp, const zb_topology_t *topology, hwloc_bitmap_t out,
                 std::string &error) {
    char *cores = nullptr;
    if (spank_get_item(sp, S_STEP_ALLOC_CORES, &cores) != ESPANK_SUCCESS) cores = nullptr;
    return alloc_cores_to_cpus(cores, topology, out, error);
}

} // namespace

bool step_cpus(spank_t sp, const zb_topology_t *topology, uint32_t job_id, uint32_t step_id,
               hwloc_bitmap_t out, std::string &source, std::string &error) {
    // The cgroup that confines the task, as libzenbind finds it (on v2, the nearest level that
    // configures cpuset.cpus): the step's when it is .../job_J/step_S (or a task_T below it,
    // whose own set is its share: then read the step above it). Anything else (no cpuset
    // controller, or cgroup v2 without ConstrainCores, where only the node's root confines) is
    // not the step's, however many CPUs it lists.
    char file[4096];
    const std::string step = "/job_" + std::to_string(job_id) + "/" + step_dir_name(step_id) + "/";
    if (zb_cgroup_cpuset(nullptr, 0, 0, out, file, sizeof file) == ZB_OK &&
        std::string(file).find(step) != std::string::npos) {
        const std::string dir = std::string(file).substr(0, std::string(file).rfind('/'));
        const bool task_level = dir.compare(dir.rfind('/') + 1, 5, "task_") == 0;
        if (task_level && zb_cgroup_cpuset(nullptr, 0, 1, out, file, sizeof file) != ZB_OK) {
            error = std::string("cannot read the step's cpuset cgroup above ") + dir + ": " +
                    zb_last_error();
            return false;
        }
        source = file;
    } else {
        // No cgroup confines the step (task/affinity alone, or cgroup v2 without ConstrainCores):
        // what Slurm says the step owns.
        if (!alloc_cores(sp, topology, out, error)) return false;
        source = "S_STEP_ALLOC_CORES";
    }
    if (hwloc_bitmap_iszero(out)) {
        error = "the step owns no CPUs on this node according to " + source;
        return false;
    }
    return true;
}

} // namespace zbspank
