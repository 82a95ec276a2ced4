// zenflow_bind.so: the Slurm glue. Options come in from plugstack.conf and --zenflow-bind; a
// step that binds hands its tasks to zenflow_bind_binder.so (stepd_binder.h), loaded only then.
// This object carries the options parser and nothing else of libzenbind, and no hwloc: every srun,
// sbatch, salloc and slurmstepd loads it. No exception leaves a callback and nothing here blocks.
#include "spank_env.hpp"
#include "spank_options.hpp"
#include "spank_tell.hpp"
#include "srun_cpu_bind.hpp"
#include "stepd_binder_loader.hpp"

#include "spank_api.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define ZB_SPANK_EXPORT __attribute__((visibility("default")))

extern "C" {
ZB_SPANK_EXPORT extern const char plugin_name[] = "zenflow_bind";
ZB_SPANK_EXPORT extern const char plugin_type[] = "spank";
ZB_SPANK_EXPORT extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
ZB_SPANK_EXPORT extern const unsigned int spank_plugin_version = 1;
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 5, 0)
// A failing init (a bad plugstack.conf argument) fails the job; the default drains the node.
ZB_SPANK_EXPORT int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif
}

namespace {

using namespace zb::spank;

// User strings are parsed in root's slurmstepd: anything longer than this is refused unread.
constexpr size_t max_option_bytes = 8192;

// Whether a failing init in slurmstepd fails only the job (slurm_spank_init_failure_mode, 25.05
// and later). Before 25.05 it fails the step's launch, and a batch job's failed launch drains the
// node, so there a bad plugstack.conf argument fails the tasks instead (State::task_error).
constexpr bool init_failure_fails_job = SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 5, 0);

struct State {
    zb_options admin{};
    // In slurmstepd, why every task of the step fails: a bad plugstack.conf argument before
    // 25.05, or user options that reach the step and cannot be applied (any user can put them
    // in the job's environment, and a site may deny what was allowed when the job was queued).
    // The step's launch must not fail instead: for a batch step that drains the node.
    std::string task_error;
    bool user_given = false;
    std::string user_text;
    Resolved resolved{};
    const zb_binder *binder = nullptr; // set once this step binds its tasks
    std::string binder_error;          // the binder could not be loaded: each task says so
};

State &state() {
    static State s;
    return s;
}

template <class F> int guarded(const char *where, F &&body) noexcept {
    try {
        return body();
    } catch (...) {
        slurm_error("zenflow-bind: %s: internal error (out of memory?)", where);
        return -1;
    }
}

int on_option(int, const char *optarg, int remote) noexcept {
    return guarded("--zenflow-bind", [&] {
        State &s = state();
        // Slurm (22.05 and 24.11 alike, spank_api.hpp) exports a bare sbatch/salloc
        // --zenflow-bind to the job's srun steps as the literal text "(null)" (a NULL printed
        // with %s): that, too, is the bare option.
        const char *text = optarg && std::strcmp(optarg, "(null)") != 0 ? optarg : "";
        if (strnlen(text, max_option_bytes + 1) > max_option_bytes) {
            const std::string error =
                "--zenflow-bind value longer than " + std::to_string(max_option_bytes) + " bytes";
            slurm_error("zenflow-bind: %s", error.c_str());
            if (!remote) return -1;
            // slurmstepd only logs a refused option and goes on with the site's values
            s.task_error = error;
            return 0;
        }
        // Slurm may deliver the option twice (command line, then environment): last one wins.
        s.user_given = true;
        s.user_text = text;
        if (!remote) {
            Resolved check;
            std::string error;
            if (!resolve(s.admin, text, check, error)) {
                slurm_error("zenflow-bind: %s", error.c_str());
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

// What the step's --cpu-bind, as srun passed it on (SLURM_CPU_BIND*: SLURM_* variables pass under
// --export=NONE too), means for --zenflow-bind: the decision srun took and reported in
// local_user_init, taken again here in every component of the step. srun cannot carry it out: a
// step it refuses is left holding its CPUs until the allocation ends, and a variable it sets
// reaches only the first component of a heterogeneous step.
CpuBindAction cpu_bind_action(spank_t sp, bool asked) {
    char given[8], type[256];
    const spank_err_t has = spank_getenv(sp, "SLURM_CPU_BIND", given, sizeof given);
    if ((has != ESPANK_SUCCESS && has != ESPANK_NOSPACE) ||
        spank_getenv(sp, "SLURM_CPU_BIND_TYPE", type, sizeof type) != ESPANK_SUCCESS)
        return CpuBindAction::none;
    std::string list(64 * 1024, '\0'); // a mask per task, for thousands of them
    const bool listed = spank_getenv(sp, "SLURM_CPU_BIND_LIST", list.data(),
                                     static_cast<int>(list.size())) == ESPANK_SUCCESS;
    return decide_cpu_bind(type, listed ? list.c_str() : nullptr, asked).action;
}

// Whether this step binds its tasks: then the binder is loaded and has set the step up.
bool binds(spank_t sp, State &s, uint32_t step_id) {
    if (!s.task_error.empty()) return false;
    std::string error;
    if (!resolve(s.admin, s.user_given ? s.user_text.c_str() : nullptr, s.resolved, error)) {
        slurm_error("zenflow-bind: %s: every task of this step fails", error.c_str());
        s.task_error = error;
        return false;
    }
    if (!s.resolved.enabled) return false;
    const bool batch_like = step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_INTERACTIVE_STEP;
    if (batch_like && !s.resolved.options.batch) return false;
    const CpuBindAction cpu_bind =
        batch_like ? CpuBindAction::none : cpu_bind_action(sp, s.user_given);
    if (cpu_bind == CpuBindAction::defer) return false; // default=on: the user's --cpu-bind wins
    if (cpu_bind == CpuBindAction::refuse) {
        s.task_error = "this step was refused (its --cpu-bind and --zenflow-bind both choose the "
                       "tasks' CPUs; srun said so above): no task runs";
        return false;
    }
    s.binder = load_binder(s.binder_error); // if not, task_init says why, per onerror=
    if (!s.binder) return false;
    s.binder->step_init(sp, &s.resolved.options);
    return true;
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
            if (context != S_CTX_REMOTE || init_failure_fails_job) {
                // srun, sbatch and salloc stop before anything starts; slurmstepd fails the job.
                slurm_error("zenflow-bind: refusing to load: %s", error.c_str());
                return -1;
            }
            slurm_error("zenflow-bind: %s: every task of this step fails", error.c_str());
            s.task_error = "the administrator's " + error;
        }
        fill_usage();
        if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
            slurm_error("zenflow-bind: cannot register --%s", opt_name);
            return -1;
        }
        return 0;
    });
}

// In srun, after its options and before any task starts: --cpu-bind is decided here
// (srun_cpu_bind.hpp), since srun sets SLURM_CPU_BIND_TYPE in its environment only when the user
// gave one.
ZB_SPANK_EXPORT int slurm_spank_local_user_init(spank_t, int, char **) {
    return guarded("local_user_init", [&] {
        State &s = state();
        Resolved resolved;
        std::string error;
        if (!resolve(s.admin, s.user_given ? s.user_text.c_str() : nullptr, resolved, error))
            return 0; // reported by on_option already
        if (!resolved.enabled) return 0;
        // srun writes SLURM_CPU_BIND with _TYPE and _LIST when it has a --cpu-bind. Without it
        // the other two are a task's own, left to an srun started inside that task after
        // `unset SLURM_CPU_BIND` (which srun reads as --cpu-bind), and srun ignores them.
        const CpuBindDecision d =
            std::getenv("SLURM_CPU_BIND")
                ? decide_cpu_bind(std::getenv("SLURM_CPU_BIND_TYPE"),
                                  std::getenv("SLURM_CPU_BIND_LIST"), s.user_given)
                : CpuBindDecision{};
        switch (d.action) {
        case CpuBindAction::none:
            return 0;
        case CpuBindAction::refuse:
            // Each task fails before it runs anything, in slurmstepd (cpu_bind_action).
            slurm_error("zenflow-bind: %s", d.message.c_str());
            return 0;
        case CpuBindAction::defer: // slurmstepd leaves the step alone (cpu_bind_action)
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
        // A step without a plan of its own keeps none it inherited (from a bound batch step):
        // its optimizer worker would pin itself to CPUs that are not this step's.
        if (!binds(sp, s, step_id)) clear_inherited_plan(sp);
        return 0; // never -1: a batch step whose launch fails drains the node
    });
}

ZB_SPANK_EXPORT int slurm_spank_task_init(spank_t sp, int, char **) {
    return guarded("task_init", [&] {
        const State &s = state();
        // Each reason below is the step's, the same for every task: the node's first says it.
        int local_id = -1;
        const bool first =
            spank_get_item(sp, S_TASK_ID, &local_id) == ESPANK_SUCCESS && local_id == 0;
        if (!s.task_error.empty()) {
            if (first) tell_user("error: " + s.task_error);
            return -1; // this task only: its parent, slurmstepd, goes on and reports it
        }
        if (s.binder) return s.binder->task_init(sp, &s.resolved.options);
        if (s.binder_error.empty()) return 0; // this step does not bind
        // It asked for binding but the binder is missing: onerror= decides, as for a bad plan.
        if (s.resolved.options.fail_on_error) {
            if (first) tell_user("error: " + s.binder_error);
            return -1;
        }
        if (first) tell_user("warning: " + s.binder_error + "; tasks left as Slurm bound them");
        return 0;
    });
}

ZB_SPANK_EXPORT int slurm_spank_exit(spank_t, int, char **) {
    State &s = state();
    if (s.binder) s.binder->step_exit();
    return 0;
}

} // extern "C"
