// zenflow_bind_binder.so: what a step that binds needs in slurmstepd (stepd_binder.h), loaded by
// zenflow_bind.so only then. Topology and profile once per step, then each task's plan,
// environment and affinity. No exception leaves an entry point.
#include "stepd_binder.h"
#include "stepd_step_cpus.hpp"
#include "stepd_task_binding.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

using namespace zb::spank;

struct Step {
    zb_topology_t *topology = nullptr;
    zb_profile_t *profile = nullptr;
    StepGpus gpus;
    std::string setup_error;    // from step_init, reported by the node's first task
    bool out_of_memory = false; // step_init ran out: nothing may allocate to say so
};

// What a catch block can say without allocating (a second bad_alloc there would terminate).
void say_internal_error() noexcept {
    static const char text[] = "zenflow-bind: internal error while binding (out of memory?)\n";
    [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, text, sizeof text - 1);
}

Step &step() {
    static Step s;
    return s;
}

// Slurm's name for this node (several slurmd may share a host), else the short host name.
std::string node_name(spank_t sp) {
    char name[256] = {};
    if (spank_getenv(sp, "SLURMD_NODENAME", name, sizeof name) == ESPANK_SUCCESS && *name)
        return name;
    if (gethostname(name, sizeof name - 1) != 0) return "?";
    name[strcspn(name, ".")] = '\0';
    return name;
}

// An impossible plan fails the task (onerror=fail) or leaves it as Slurm bound it, without the
// ZENFLOW_* variables (warn). A failure alike for every task of the node (the step's topology,
// CPUs, profile or plan) is told once, by its first task.
int failed(spank_t sp, const zb_options &options, const TaskInfo &task, const std::string &error,
           bool node_wide = false) {
    const bool tell = !node_wide || task.local_id == 0;
    const bool others = node_wide && task.ntasks > 1;
    const std::string who =
        task.host + (node_wide ? std::string() : " task " + std::to_string(task.local_id)) + ": ";
    if (options.fail_on_error) {
        if (tell) tell_user(who + "error: " + error + (others ? " (every task of the node)" : ""));
        return -1;
    }
    clear_env(sp);
    if (tell)
        tell_user(who + "warning: " + error +
                  (others ? "; the node's tasks left as Slurm bound them"
                          : "; task left as Slurm bound it"));
    return 0;
}

// Where GPUs are discovered: "/", or the tree slurmd's environment names (tests, and containers
// that mount the host's /sys and /proc elsewhere).
constexpr const char *kGpuRootVariable = "ZENFLOW_BIND_GPU_ROOT";

void step_init(spank_t sp, const zb_options *options) noexcept {
    try {
        Step &s = step();
        if (zb_topology_load(&s.topology) != ZB_OK) {
            s.setup_error = std::string("cannot load the topology: ") + zb_last_error();
            return;
        }
        // Read with the user's identity (user_init runs after slurmstepd dropped privileges):
        // the path is the user's, so root must not open it on the user's behalf.
        // A profile sizes the optimizer worker's share; mode=offload has none to size.
        const char *path = options->profile;
        if (*path && options->mode != ZB_MODE_OFFLOAD && zb_profile_load(path, &s.profile) != ZB_OK)
            s.setup_error = std::string("cannot load profile=") + path + ": " + zb_last_error();
        load_step_gpus(sp, *options, std::getenv(kGpuRootVariable), s.gpus);
    } catch (...) {
        step().out_of_memory = true;
    }
}

int task_init(spank_t sp, const zb_options *options) noexcept {
    try {
        const Step &s = step();
        TaskInfo task{};
        int local_id = 0;
        uint32_t step_id = 0;
        task.host = node_name(sp);
        if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &task.ntasks) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_TASK_ID, &local_id) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_TASK_GLOBAL_ID, &task.global_id) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS || local_id < 0)
            return failed(sp, *options, task, "Slurm did not describe the task");
        task.local_id = static_cast<unsigned>(local_id);
        char cpu_bind_verbose[16] = {};
        task.slurm_verbose = spank_getenv(sp, "SLURM_CPU_BIND_VERBOSE", cpu_bind_verbose,
                                          sizeof cpu_bind_verbose) == ESPANK_SUCCESS &&
                             std::strcmp(cpu_bind_verbose, "verbose") == 0;
        if (s.out_of_memory)
            return failed(sp, *options, task, "out of memory loading the topology", true);
        if (!s.setup_error.empty()) return failed(sp, *options, task, s.setup_error, true);

        std::unique_ptr<zb_cpuset_t, void (*)(zb_cpuset_t *)> cpus(zb_cpuset_alloc(),
                                                                   zb_cpuset_free);
        std::string error;
        if (!cpus) return failed(sp, *options, task, "out of memory");
        if (!step_cpus(sp, s.topology, step_id, cpus.get(), task.step_cpus_source, error))
            return failed(sp, *options, task, error, true);
        bool node_wide = false;
        if (!bind_task(sp, s.topology, s.profile, &s.gpus, cpus.get(), *options, task, error,
                       node_wide))
            return failed(sp, *options, task, error, node_wide);
        return 0;
    } catch (...) {
        say_internal_error();
        return options->fail_on_error ? -1 : 0;
    }
}

void step_exit() noexcept {
    Step &s = step();
    zb_profile_free(s.profile);
    s.profile = nullptr;
    zb_gpus_free(s.gpus.gpus);
    s.gpus = StepGpus{};
    zb_topology_free(s.topology);
    s.topology = nullptr;
}

const zb_binder binder = {ZB_BINDER_ABI, step_init, task_init, step_exit};

} // namespace

extern "C" __attribute__((visibility("default"))) const zb_binder *zb_binder_get(void) {
    return &binder;
}
