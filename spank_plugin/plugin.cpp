// zenflow_bind.so: the Slurm glue. Options come in from plugstack.conf and --zenflow-bind,
// affinity and environment go out at task launch; parsing, topology and planning are
// libzenbind's. No exception leaves a callback and nothing here blocks.
#include "cpu_bind.hpp"
#include "policy.hpp"
#include "step_cpus.hpp"
#include "task_binding.hpp"

#include "slurm_api.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#define ZB_SPANK_EXPORT __attribute__((visibility("default")))

extern "C" {
ZB_SPANK_EXPORT extern const char plugin_name[] = "zenflow_bind";
ZB_SPANK_EXPORT extern const char plugin_type[] = "spank";
ZB_SPANK_EXPORT extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
ZB_SPANK_EXPORT extern const unsigned int spank_plugin_version = 1;
}

namespace {

using namespace zbspank;

// Set by srun in the step's environment when the user's --cpu-bind wins over default=on.
constexpr const char *kDeferVariable = "ZENFLOW_BIND_DEFERRED";

// User strings are parsed in root's slurmstepd: anything longer than this is refused unread.
constexpr size_t max_option_bytes = 8192;

struct State {
    zb_options admin{};
    bool user_given = false;
    std::string user_text;
    Resolved resolved{};
    bool active = false; // this step binds its tasks
    zb_topology_t *topology = nullptr;
    zb_profile_t *profile = nullptr;
    std::string setup_error; // from user_init, reported by each task
};

State &state() {
    static State s;
    return s;
}

template <class F> int guarded(const char *where, F &&body) noexcept {
    try {
        return body();
    } catch (...) {
        slurm_error("zenflow_bind: %s: internal error (out of memory?)", where);
        return -1;
    }
}

int on_option(int, const char *optarg, int remote) noexcept {
    return guarded("--zenflow-bind", [&] {
        State &s = state();
        // Slurm 22.05 exports a bare sbatch/salloc --zenflow-bind to the job's srun steps as the
        // literal text "(null)" (a NULL printed with %s): that, too, is the bare option.
        const char *text = optarg && std::strcmp(optarg, "(null)") != 0 ? optarg : "";
        if (strnlen(text, max_option_bytes + 1) > max_option_bytes) {
            slurm_error("--zenflow-bind: value longer than %zu bytes", max_option_bytes);
            return -1;
        }
        // Slurm may deliver the option twice (command line, then environment): last one wins.
        s.user_given = true;
        s.user_text = text;
        if (!remote) {
            Resolved check;
            std::string error;
            if (!resolve(s.admin, text, check, error)) {
                slurm_error("%s", error.c_str());
                return -1;
            }
        }
        return 0;
    });
}

char opt_name[] = "zenflow-bind";
char opt_arginfo[] = "OPTS";
// Filled from libzenbind's key table before the option is registered.
char opt_usage[1024];
spank_option option = {opt_name, opt_arginfo, opt_usage, 2, 0, on_option};

void fill_usage() {
    char keys[768];
    if (zb_options_usage(ZB_SCOPE_USER, keys, sizeof keys) < 0) keys[0] = '\0';
    std::snprintf(opt_usage, sizeof opt_usage,
                  "Bind each task's training and optimizer CPUs for ZenFlow. OPTS is a comma "
                  "list of %s (zenflow_bind(8))",
                  keys);
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
// ZENFLOW_* variables (warn).
int failed(spank_t sp, const State &s, const TaskInfo &task, const std::string &error) {
    const std::string who = task.host + " task " + std::to_string(task.local_id) + ": ";
    if (s.resolved.options.fail_on_error) {
        tell_user(who + "error: " + error);
        return -1;
    }
    clear_env(sp);
    tell_user(who + "warning: " + error + "; task left as Slurm bound it");
    return 0;
}

} // namespace

extern "C" {

ZB_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char **av) {
    return guarded("init", [&] {
        const spank_context_t context = spank_context();
        if (context != S_CTX_LOCAL && context != S_CTX_REMOTE && context != S_CTX_ALLOCATOR)
            return 0; // nothing to do in slurmd or prolog/epilog
        State &s = state();
        s = State{};
        std::string error;
        if (!parse_admin(ac, av, s.admin, error)) {
            slurm_error("zenflow_bind: refusing to load: %s", error.c_str());
            return -1;
        }
        fill_usage();
        if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
            slurm_error("zenflow_bind: cannot register --%s", opt_name);
            return -1;
        }
        return 0;
    });
}

// In srun, after its options and before any task starts: --cpu-bind is decided here (cpu_bind.hpp),
// since srun sets SLURM_CPU_BIND_TYPE in its environment only when the user gave one.
ZB_SPANK_EXPORT int slurm_spank_local_user_init(spank_t, int, char **) {
    return guarded("local_user_init", [&] {
        State &s = state();
        Resolved resolved;
        std::string error;
        if (!resolve(s.admin, s.user_given ? s.user_text.c_str() : nullptr, resolved, error))
            return 0; // reported by on_option already
        if (!resolved.enabled) return 0;
        const CpuBindDecision d = decide_cpu_bind(std::getenv("SLURM_CPU_BIND_TYPE"),
                                                  std::getenv("SLURM_CPU_BIND_LIST"), s.user_given);
        switch (d.action) {
        case CpuBindAction::none:
            return 0;
        case CpuBindAction::refuse:
            slurm_error("--zenflow-bind: %s", d.message.c_str());
            return -1;
        case CpuBindAction::defer:
            // srun hands its own environment to the tasks (spank_setenv is for slurmstepd).
            if (setenv(kDeferVariable, "cpu-bind", 1) != 0) {
                slurm_error("--zenflow-bind: cannot pass the --cpu-bind decision to the tasks");
                return -1;
            }
            [[fallthrough]];
        case CpuBindAction::refine:
            tell_user(d.message);
            return 0;
        }
        return 0;
    });
}

ZB_SPANK_EXPORT int slurm_spank_user_init(spank_t sp, int, char **) {
    return guarded("user_init", [&] {
        State &s = state();
        uint32_t step_id = 0;
        if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) return 0;
        if (step_id == SLURM_EXTERN_CONT) return 0;
        std::string error;
        if (!resolve(s.admin, s.user_given ? s.user_text.c_str() : nullptr, s.resolved, error)) {
            slurm_error("%s", error.c_str());
            return -1;
        }
        if (!s.resolved.enabled) return 0;
        char deferred[32] = {};
        if (spank_getenv(sp, kDeferVariable, deferred, sizeof deferred) == ESPANK_SUCCESS) {
            spank_unsetenv(sp, kDeferVariable);
            return 0; // srun left this step to the user's --cpu-bind
        }
        const bool batch_like = step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_INTERACTIVE_STEP;
        if (batch_like && !s.resolved.options.batch) return 0;
        s.active = true;
        // Once per step, in slurmstepd; every forked task inherits it.
        if (zb_topology_load(&s.topology) != ZB_OK) {
            s.setup_error = std::string("cannot load the topology: ") + zb_last_error();
            return 0;
        }
        // Read with the user's identity (user_init runs after slurmstepd dropped privileges):
        // the path is the user's, so root must not open it on the user's behalf.
        const char *path = s.resolved.options.profile;
        if (*path && zb_profile_load(path, &s.profile) != ZB_OK)
            s.setup_error = std::string("cannot load profile=") + path + ": " + zb_last_error();
        return 0;
    });
}

ZB_SPANK_EXPORT int slurm_spank_task_init(spank_t sp, int, char **) {
    return guarded("task_init", [&] {
        State &s = state();
        if (!s.active) return 0;
        TaskInfo task{};
        int local_id = 0;
        uint32_t job_id = 0, step_id = 0;
        task.host = node_name(sp);
        if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &task.ntasks) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_TASK_ID, &local_id) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_TASK_GLOBAL_ID, &task.global_id) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS || local_id < 0)
            return failed(sp, s, task, "Slurm did not describe the task");
        task.local_id = static_cast<unsigned>(local_id);
        char cpu_bind_verbose[16] = {};
        task.slurm_verbose = spank_getenv(sp, "SLURM_CPU_BIND_VERBOSE", cpu_bind_verbose,
                                          sizeof cpu_bind_verbose) == ESPANK_SUCCESS &&
                             std::strcmp(cpu_bind_verbose, "verbose") == 0;
        if (!s.setup_error.empty()) return failed(sp, s, task, s.setup_error);

        std::unique_ptr<hwloc_bitmap_s, void (*)(hwloc_bitmap_t)> cpus(hwloc_bitmap_alloc(),
                                                                       hwloc_bitmap_free);
        std::string error;
        if (!cpus) return failed(sp, s, task, "out of memory");
        if (!step_cpus(sp, s.topology, job_id, step_id, cpus.get(), task.step_cpus_source, error))
            return failed(sp, s, task, error);
        if (!bind_task(sp, s.topology, s.profile, cpus.get(), s.resolved.options, task, error))
            return failed(sp, s, task, error);
        return 0;
    });
}

ZB_SPANK_EXPORT int slurm_spank_exit(spank_t, int, char **) {
    State &s = state();
    zb_profile_free(s.profile);
    s.profile = nullptr;
    zb_topology_free(s.topology);
    s.topology = nullptr;
    return 0;
}

} // extern "C"
