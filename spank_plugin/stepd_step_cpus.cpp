#include "stepd_step_cpus.hpp"

#include "stepd_alloc_cores.hpp"
#include "stepd_step_source.hpp"

#include <fstream>
#include <sstream>

namespace zb::spank {
namespace {

bool alloc_cores(spank_t sp, const zb_topology_t *topology, zb_cpuset_t *out, std::string &error) {
    char *cores = nullptr;
    if (spank_get_item(sp, S_STEP_ALLOC_CORES, &cores) != ESPANK_SUCCESS) cores = nullptr;
    return alloc_cores_to_cpus(cores, topology, out, error);
}

// This task's own cgroup, where its cpuset is (empty when /proc/self/cgroup cannot be read:
// then zb_cgroup_cpuset() fails too, and says why).
std::string own_cgroup() {
    std::ifstream in("/proc/self/cgroup");
    std::ostringstream text;
    text << in.rdbuf();
    return task_cgroup(text.str());
}

} // namespace

bool step_cpus(spank_t sp, const zb_topology_t *topology, uint32_t step_id, zb_cpuset_t *out,
               std::string &source, std::string &error) {
    // The cgroup that confines the task, as libzenbind finds it (on v2, the nearest level that
    // configures cpuset.cpus); step_source() says whether it is the step's, from the task's own
    // cgroup, whatever Slurm named the job's level.
    char file[4096] = {};
    const zb_status status = zb_cgroup_cpuset(nullptr, 0, 0, out, file, sizeof file);
    switch (step_source(status, file, own_cgroup(), step_id)) {
    case StepSource::failed:
        error = std::string("cannot read this task's cpuset cgroup: ") + zb_last_error();
        return false;
    case StepSource::step_cgroup_above:
        if (zb_cgroup_cpuset(nullptr, 0, 1, out, file, sizeof file) != ZB_OK) {
            error = std::string("cannot read the step's cpuset cgroup above ") + file + ": " +
                    zb_last_error();
            return false;
        }
        source = file;
        break;
    case StepSource::step_cgroup:
        source = file;
        break;
    case StepSource::alloc_cores:
        if (!alloc_cores(sp, topology, out, error)) return false;
        source = "S_STEP_ALLOC_CORES";
        break;
    }
    if (zb_cpuset_weight(out) == 0) {
        error = "the step owns no CPUs on this node according to " + source;
        return false;
    }
    return true;
}

} // namespace zb::spank
