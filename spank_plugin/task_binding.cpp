#include "task_binding.hpp"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace zb::spank {
namespace {

using PlanPtr = std::unique_ptr<zb_plan_t, void (*)(zb_plan_t *)>;

constexpr const auto &kVariables = kTaskVariables;
constexpr size_t kVariableCount = kTaskVariableCount;

// The task's OMP_NUM_THREADS before binding, put back when binding fails half-way, so that
// onerror=warn leaves the task exactly as Slurm started it.
class SavedThreads {
  public:
    explicit SavedThreads(spank_t sp) : sp_(sp) {
        had_ = spank_getenv(sp, "OMP_NUM_THREADS", value_, sizeof value_) == ESPANK_SUCCESS;
    }
    void restore() const {
        if (had_)
            spank_setenv(sp_, "OMP_NUM_THREADS", value_, 1);
        else
            spank_unsetenv(sp_, "OMP_NUM_THREADS");
    }

  private:
    spank_t sp_;
    bool had_ = false;
    char value_[64] = {};
};

bool set_affinity(hwloc_const_bitmap_t cpus, std::string &error) {
    const int last = hwloc_bitmap_last(cpus);
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
    int cpu;
    hwloc_bitmap_foreach_begin(cpu, cpus) {
        CPU_SET_S(cpu, size, mask.get());
    }
    hwloc_bitmap_foreach_end();
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
    char buf[ZB_PROFILE_PATH_MAX + 512];
    return zb_options_format(&options, buf, sizeof buf) >= 0 ? buf : "";
}

} // namespace

std::string cpulist(hwloc_const_bitmap_t set) {
    char small[256];
    const int n = zb_cpulist_format(set, small, sizeof small);
    if (n < 0) return "infinite";
    if (static_cast<size_t>(n) < sizeof small) return small;
    std::string big(static_cast<size_t>(n) + 1, '\0');
    zb_cpulist_format(set, big.data(), big.size());
    big.resize(static_cast<size_t>(n));
    return big;
}

bool bind_task(spank_t sp, const zb_topology_t *topology, const zb_profile_t *profile,
               hwloc_const_bitmap_t step_cpus, const zb_options &given, const TaskInfo &task,
               std::string &error) {
    zb_options options = given;
    // A profile sizes the optimizer worker's share; offload has none.
    if (profile && options.mode != ZB_MODE_OFFLOAD &&
        zb_profile_apply(profile, topology, step_cpus, task.ntasks, &options) != ZB_OK) {
        error = std::string("cannot apply profile=") + options.profile + ": " + zb_last_error();
        return false;
    }
    zb_plan_t *raw = nullptr;
    if (zb_plan_compute(topology, step_cpus, task.ntasks, &options, &raw) != ZB_OK) {
        error = std::string("no plan for ") + std::to_string(task.ntasks) + " task(s) on CPUs " +
                cpulist(step_cpus) + ": " + zb_last_error();
        return false;
    }
    PlanPtr plan(raw, zb_plan_free);
    // Every task computes the same plan; the first one on the node speaks for all.
    if (task.local_id == 0) {
        for (unsigned i = 0; i < zb_plan_nwarnings(plan.get()); ++i)
            if (const char *w = zb_plan_warning(plan.get(), i))
                tell_user(task.host + ": warning: " + w);
    }
    zb_task_plan share;
    if (zb_plan_task(plan.get(), task.local_id, &share) != ZB_OK) {
        error = std::string("no share for task ") + std::to_string(task.local_id) + ": " +
                zb_last_error();
        return false;
    }
    // The environment first and the affinity last: a failure on the way (onerror=warn) leaves
    // the task as Slurm bound it once clear_env() has run.
    const std::string train = cpulist(share.train_cpus), opt = cpulist(share.opt_cpus),
                      mems = cpulist(share.opt_mems), nodes = cpulist(share.nodes);
    const std::string values[kVariableCount] = {std::to_string(share.train_threads),
                                                train,
                                                opt,
                                                std::to_string(share.opt_threads),
                                                mems,
                                                cpulist(share.cpus),
                                                cpulist(step_cpus),
                                                options_text(options)};
    // mode=offload has no optimizer worker: the ZENFLOW_OPT_* variables stay unset.
    const bool offload = options.mode == ZB_MODE_OFFLOAD;
    const SavedThreads saved(sp);
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
    const std::string where = ", NUMA node " + nodes + ", step CPUs " + cpulist(step_cpus) +
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
