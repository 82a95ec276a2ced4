#include "stepd_step_source.hpp"

#include "spank_api.hpp"

#include <vector>

namespace zb::spank {
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

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> parts;
    while (!s.empty()) {
        const size_t end = s.find(sep);
        const std::string_view part = s.substr(0, end);
        if (!part.empty()) parts.push_back(part);
        if (end == s.npos) break;
        s.remove_prefix(end + 1);
    }
    return parts;
}

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

} // namespace

std::string task_cgroup(std::string_view proc_self_cgroup) {
    std::string_view v2;
    for (std::string_view line : split(proc_self_cgroup, '\n')) {
        const size_t c1 = line.find(':');
        const size_t c2 = c1 == line.npos ? line.npos : line.find(':', c1 + 1);
        if (c2 == line.npos) continue;
        const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
        if (line.substr(0, c1) == "0" && controllers.empty()) v2 = line.substr(c2 + 1);
        for (std::string_view c : split(controllers, ','))
            if (c == "cpuset") return std::string(line.substr(c2 + 1));
    }
    return std::string(v2);
}

StepSource step_source(zb_status status, const std::string &file, std::string_view cgroup,
                       uint32_t step_id) {
    if (status == ZB_ENOENT) return StepSource::alloc_cores;
    if (status != ZB_OK) return StepSource::failed;
    // Slurm's levels below a step: task_T, and on v2 user/ between them (slurmstepd's own
    // processes are in step_S/slurm, never a task's).
    const std::vector<std::string_view> parts = split(cgroup, '/');
    size_t step = parts.size();
    if (step > 0 && parts[step - 1].starts_with("task_")) --step;
    if (step > 0 && parts[step - 1] == "user") --step;
    if (step < 2 || parts[step - 1] != step_dir_name(step_id)) return StepSource::alloc_cores;
    // The level the file was read at, matched from the job's level down to the task's, so that
    // the mount point and whatever lies above the job never matter.
    const std::string_view dir = std::string_view(file).substr(0, file.rfind('/'));
    std::string level;
    for (size_t i = step - 2; i < parts.size(); ++i) {
        level += "/";
        level += parts[i];
        if (i + 1 >= step && ends_with(dir, level))
            return parts[i].starts_with("task_") ? StepSource::step_cgroup_above
                                                 : StepSource::step_cgroup;
    }
    return StepSource::alloc_cores;
}

} // namespace zb::spank
