#include "step_cpus.hpp"

#include <memory>

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

// Slurm numbers a node's cores 0..sockets*cores-1 in its credential, socket by socket, which is
// hwloc's logical core order (slurmd builds its abstract-to-machine map from hwloc the same way).
bool alloc_cores_to_cpus(spank_t sp, const zb_topology_t *topology, hwloc_bitmap_t out,
                         std::string &error) {
    char *cores = nullptr;
    if (spank_get_item(sp, S_STEP_ALLOC_CORES, &cores) != ESPANK_SUCCESS || !cores || !*cores) {
        error = "Slurm gave no S_STEP_ALLOC_CORES for this step";
        return false;
    }
    std::unique_ptr<hwloc_bitmap_s, void (*)(hwloc_bitmap_t)> ids(hwloc_bitmap_alloc(),
                                                                  hwloc_bitmap_free);
    if (!ids || zb_cpulist_parse(cores, ids.get()) != ZB_OK) {
        error = std::string("cannot read S_STEP_ALLOC_CORES '") + cores + "': " + zb_last_error();
        return false;
    }
    hwloc_topology_t topo = zb_topology_hwloc(topology);
    hwloc_bitmap_zero(out);
    int id;
    hwloc_bitmap_foreach_begin(id, ids.get()) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(id));
        if (!core) {
            error = "Slurm allocated core " + std::to_string(id) + " but this node has only " +
                    std::to_string(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE)) +
                    " cores: slurm.conf does not describe this node as slurmd -C does";
            return false;
        }
        hwloc_bitmap_or(out, out, core->cpuset);
    }
    hwloc_bitmap_foreach_end();
    return true;
}

} // namespace

bool step_cpus(spank_t sp, const zb_topology_t *topology, uint32_t job_id, uint32_t step_id,
               hwloc_bitmap_t out, std::string &source, std::string &error) {
    // The task's cpuset cgroup, as libzenbind finds it; it is the step's when its directory is
    // .../job_J/step_S (22.05 on cgroup v1 puts tasks there) or .../job_J/step_S/user/task_T
    // (cgroup v2, where the task inherits the step's effective cpuset: read the step above).
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
        // No cpuset cgroup for the step (task/affinity alone): what Slurm says the step owns.
        if (!alloc_cores_to_cpus(sp, topology, out, error)) return false;
        source = "S_STEP_ALLOC_CORES";
    }
    if (hwloc_bitmap_iszero(out)) {
        error = "the step owns no CPUs on this node according to " + source;
        return false;
    }
    return true;
}

} // namespace zbspank
