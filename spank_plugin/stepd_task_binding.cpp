#include "stepd_task_binding.hpp"

#include <zenbind/hwloc.h>

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace zb::spank {
namespace {

using PlanPtr = std::unique_ptr<zb_plan_t, void (*)(zb_plan_t *)>;

constexpr const auto &kVariables = kTaskVariables;
constexpr size_t kVariableCount = kTaskVariableCount;

// What binding sets in the task's environment (kTaskVariables, the user's OMP_NUM_THREADS it
// keeps), as it was before: put back when binding fails half-way, so that onerror=warn leaves the
// task as Slurm started it and clear_env() then finds any plan it inherited as it came. A value
// too long to read back whole (4 KiB) is left as binding set it rather than unset.
class SavedVariables {
  public:
    explicit SavedVariables(spank_t sp) : sp_(sp) {
        for (size_t i = 0; i < kCount; ++i) {
            value_[i].resize(4096);
            found_[i] = spank_getenv(sp, name(i), value_[i].data(), 4096);
        }
    }
    void restore() const {
        for (size_t i = 0; i < kCount; ++i) {
            if (found_[i] == ESPANK_SUCCESS)
                spank_setenv(sp_, name(i), value_[i].c_str(), 1);
            else if (found_[i] != ESPANK_NOSPACE)
                spank_unsetenv(sp_, name(i));
        }
    }

  private:
    static constexpr size_t kCount = kVariableCount + 1;
    static const char *name(size_t i) {
        return i < kVariableCount ? kVariables[i] : kUserThreadsVariable;
    }
    spank_t sp_;
    spank_err_t found_[kCount] = {};
    std::string value_[kCount];
};

bool set_affinity(const zb_cpuset_t *cpus, std::string &error) {
    const int last = hwloc_bitmap_last(zb_cpuset_hwloc_const(cpus)); // -1: empty or infinite
    if (last < 0 || last > ZB_CPULIST_MAX_ID) {
        error = "planned CPU set '" + cpulist(cpus) + "' is not a finite set of CPUs";
        return false;
    }
    const size_t size = CPU_ALLOC_SIZE(last + 1);
    const auto free_set = [](cpu_set_t *set) { CPU_FREE(set); };
    std::unique_ptr<cpu_set_t, decltype(free_set)> mask(CPU_ALLOC(last + 1), free_set);
    if (!mask) {
        error = "out of memory";
        return false;
    }
    CPU_ZERO_S(size, mask.get());
    for (int cpu = zb_cpuset_next(cpus, -1); cpu >= 0; cpu = zb_cpuset_next(cpus, cpu))
        CPU_SET_S(cpu, size, mask.get());
    if (sched_setaffinity(0, size, mask.get()) != 0) {
        error = "sched_setaffinity(" + cpulist(cpus) + "): " + std::strerror(errno);
        return false;
    }
    return true;
}

std::string threads(unsigned n) {
    return std::to_string(n) + (n == 1 ? " thread" : " threads");
}

std::string options_text(const zb_options &options) {
    const int n = zb_options_format(&options, nullptr, 0); // like snprintf: the length it needs
    if (n < 0) return "";
    std::string text(static_cast<size_t>(n) + 1, '\0');
    zb_options_format(&options, text.data(), text.size());
    text.resize(static_cast<size_t>(n));
    return text;
}

// Where the step's GPU list comes from, first found wins: Slurm's own indexes (what gres.conf
// numbers, with or without ConstrainDevices: the step's, or the batch step's the job's), then a
// vendor variable set without Slurm's gres.
constexpr const char *kGpuVariables[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                                         "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                         "GPU_DEVICE_ORDINAL"};

std::string env(spank_t sp, const char *name) {
    char value[4096] = {};
    if (spank_getenv(sp, name, value, sizeof value) != ESPANK_SUCCESS) return "";
    return value;
}

// What the plan knows of the tasks' GPUs: each local task's GPU index and its NUMA node (-1 when
// unknown), and the sentences that say why a task is not placed by its GPU.
struct TaskGpus {
    std::vector<unsigned> index;
    std::vector<int> node;
    std::vector<std::string> notes; // for the whole node: said once, by local task 0
    std::string own_note;           // this task only
};

TaskGpus task_gpus(spank_t sp, const StepGpus &step, const TaskInfo &task) {
    TaskGpus t;
    if (step.list.empty()) return t;
    if (!step.problem.empty()) {
        t.notes.push_back("GPU placement off: " + step.problem);
        return t;
    }
    t.index.assign(task.ntasks, 0);
    if (zb_gpus_assign(step.list.c_str(), task.ntasks, t.index.data()) != ZB_OK) {
        t.notes.push_back("GPU placement off: " + step.variable + ": " + zb_last_error());
        t.index.clear();
        return t;
    }
    t.node.assign(task.ntasks, -1);
    for (unsigned i = 0; i < task.ntasks; ++i) {
        zb_gpu gpu;
        if (zb_gpus_find(step.gpus, t.index[i], &gpu) != ZB_OK)
            t.notes.push_back("task " + std::to_string(i) + ": " + zb_last_error() +
                              ": share taken in order");
        else if (gpu.numa_node < 0)
            t.notes.push_back("task " + std::to_string(i) + ": GPU " + std::to_string(gpu.index) +
                              " (" + gpu.bus_id + ") has no known NUMA node in " +
                              zb_gpus_source(step.gpus) + ": share taken in order");
        else
            t.node[i] = gpu.numa_node;
    }
    // Slurm narrowed this task's list (--gpus-per-task, --gpu-bind): its own first GPU is the
    // truth for it; when the step-wide rule assumed another, the share stays where the rule put
    // it (every task must compute the same plan) and the task says so.
    const std::string own = env(sp, step.variable.c_str());
    unsigned first = 0;
    if (!own.empty() && own != step.list && zb_gpus_assign(own.c_str(), 1, &first) == ZB_OK &&
        first != t.index[task.local_id])
        t.own_note = "task " + std::to_string(task.local_id) + " drives GPU " +
                     std::to_string(first) + " (" + step.variable + "=" + own +
                     ") but the plan placed it by GPU " + std::to_string(t.index[task.local_id]) +
                     ", the one of the step's " + step.list + " its rank gets";
    return t;
}

} // namespace

void load_step_gpus(spank_t sp, const zb_options &options, const char *fsroot, StepGpus &out) {
    if (options.gpu == ZB_GPU_IGNORE) return;
    // SLURM_JOB_GPUS is the batch (or interactive) step's list: a step srun starts from the batch
    // script inherits it, whether or not it has GPUs of its own. SLURM_STEP_GPUS is a step's:
    // slurmstepd never sets it for the batch step, which may carry one from where sbatch ran
    // (inside another job's GPU step, on another node).
    uint32_t step_id = 0;
    const bool batch_like = spank_get_item(sp, S_JOB_STEPID, &step_id) == ESPANK_SUCCESS &&
                            (step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_INTERACTIVE_STEP);
    for (const char *name : kGpuVariables) {
        if (!std::strcmp(name, batch_like ? "SLURM_STEP_GPUS" : "SLURM_JOB_GPUS")) continue;
        out.list = env(sp, name);
        if (out.list.empty()) continue;
        out.variable = name;
        break;
    }
    if (out.list.empty()) return;
    if (zb_gpus_load(fsroot, options.gpumap, &out.gpus) != ZB_OK)
        out.problem = std::string("cannot tell which NUMA node the step's GPUs (") + out.variable +
                      "=" + out.list + ") are on: " + zb_last_error();
}

bool bind_task(spank_t sp, const zb_topology_t *topology, const zb_profile_t *profile,
               const StepGpus *step_gpus, const zb_cpuset_t *step_cpus, const zb_options &given,
               const TaskInfo &task, std::string &error, bool &node_wide) {
    zb_options options = given;
    node_wide = true; // until the plan is made, every task of the node fails alike
    // A profile sizes the optimizer worker's share; offload has none.
    if (profile && options.mode != ZB_MODE_OFFLOAD &&
        zb_profile_apply(profile, topology, step_cpus, task.ntasks, &options) != ZB_OK) {
        error = std::string("cannot apply profile=") + options.profile + ": " + zb_last_error();
        return false;
    }
    TaskGpus gpus = step_gpus ? task_gpus(sp, *step_gpus, task) : TaskGpus{};
    // On a single NUMA node there is nothing to place: a GPU's unknown node is no news.
    if (hwloc_get_nbobjs_by_type(zb_topology_hwloc(topology), HWLOC_OBJ_NUMANODE) < 2)
        gpus.notes.clear();
    zb_plan_t *raw = nullptr;
    if (zb_plan_compute(topology, step_cpus, task.ntasks, &options,
                        gpus.node.empty() ? nullptr : gpus.node.data(), 0, &raw) != ZB_OK) {
        error = std::string("no plan for ") + std::to_string(task.ntasks) + " task(s) on CPUs " +
                cpulist(step_cpus) + ": " + zb_last_error();
        return false;
    }
    PlanPtr plan(raw, zb_plan_free);
    node_wide = false;
    // Every task computes the same plan; the first one on the node speaks for all.
    if (task.local_id == 0) {
        for (const std::string &note : gpus.notes)
            tell_user(task.host + ": warning: " + note);
        for (unsigned i = 0; i < zb_plan_nwarnings(plan.get()); ++i)
            if (const char *w = zb_plan_warning(plan.get(), i))
                tell_user(task.host + ": warning: " + w);
    }
    if (!gpus.own_note.empty()) tell_user(task.host + ": warning: " + gpus.own_note);
    zb_task_plan share;
    if (zb_plan_task(plan.get(), task.local_id, &share) != ZB_OK) {
        error = std::string("no share for task ") + std::to_string(task.local_id) + ": " +
                zb_last_error();
        return false;
    }
    // The environment first and the affinity last: a failure on the way (onerror=warn) leaves
    // the task as Slurm bound it once clear_env() has run.
    const std::string train = cpulist(share.train_cpus), opt = cpulist(share.opt_cpus),
                      mems = cpulist(share.opt_mems), nodes = cpulist(share.nodes),
                      train_threads = std::to_string(share.train_threads);
    // OMP_NUM_THREADS and ZENFLOW_TRAIN_THREADS: the same count
    const std::string values[kVariableCount] = {train_threads,
                                                train_threads,
                                                train,
                                                opt,
                                                std::to_string(share.opt_threads),
                                                mems,
                                                cpulist(share.cpus),
                                                cpulist(step_cpus),
                                                options_text(options)};
    // mode=offload has no optimizer worker: the ZENFLOW_OPT_* variables stay unset.
    const bool offload = options.mode == ZB_MODE_OFFLOAD;
    const SavedVariables saved(sp);
    keep_user_threads(sp);
    for (size_t i = 0; i < kVariableCount; ++i) {
        if (offload && std::strncmp(kVariables[i], "ZENFLOW_OPT_", 12) == 0) {
            spank_unsetenv(sp, kVariables[i]);
            continue;
        }
        if (spank_setenv(sp, kVariables[i], values[i].c_str(), 1) != ESPANK_SUCCESS) {
            error = std::string("cannot set ") + kVariables[i] + " in the task's environment";
            saved.restore();
            return false;
        }
    }
    if (!set_affinity(share.train_cpus, error)) {
        saved.restore();
        return false;
    }

    // After Slurm's own --cpu-bind=verbose line, say that its mask is no longer the task's.
    if (!options.verbose && !task.slurm_verbose) return true;
    const std::string who = task.host + " task " + std::to_string(task.local_id) + " (rank " +
                            std::to_string(task.global_id) + "): ";
    const int gpu_node = zb_plan_task_gpu_node(plan.get(), task.local_id);
    const std::string gpu = gpus.index.empty()
                                ? ""
                                : ", GPU " + std::to_string(gpus.index[task.local_id]) + " on " +
                                      (gpu_node < 0 ? std::string("an unknown node")
                                                    : "node " + std::to_string(gpu_node));
    const std::string where = ", NUMA node " + nodes + gpu + ", step CPUs " + cpulist(step_cpus) +
                              " from " + task.step_cpus_source +
                              (task.slurm_verbose ? "; replaces the --cpu-bind mask above" : "");
    if (offload)
        tell_user(who + "offload " + train + " (" + threads(share.train_threads) +
                  ", training and optimizer in-process)" + where);
    else
        tell_user(who + "train " + train + " (" + threads(share.train_threads) + "), optimizer " +
                  opt + " (" + threads(share.opt_threads) + ", memory on node " + mems + ")" +
                  where);
    return true;
}

} // namespace zb::spank
