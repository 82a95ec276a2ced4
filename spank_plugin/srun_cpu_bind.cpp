#include "srun_cpu_bind.hpp"

#include <string_view>

namespace zb::spank {
namespace {

// The type words Slurm writes into SLURM_CPU_BIND_TYPE that choose CPUs or turn binding off.
bool chooses_cpus(std::string_view word) {
    for (std::string_view prefix : {"map_cpu", "mask_cpu", "map_ldom", "mask_ldom", "rank"})
        if (word.substr(0, prefix.size()) == prefix) return true;
    return word == "none" || word == "no";
}

} // namespace

CpuBindDecision decide_cpu_bind(const char *type, const char *list, bool asked) {
    std::string kept; // the type words, without verbose/quiet, a "map_cpu:" with its list
    bool choose = false;
    for (std::string_view rest = type ? type : ""; !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string_view word = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (word.empty() || word == "verbose" || word == "v" || word == "quiet" || word == "q")
            continue;
        // Decided on the type words alone: the list is CPU numbers, never a type.
        choose = choose || chooses_cpus(word);
        kept += kept.empty() ? "" : ",";
        kept += word;
        if (word.back() == ':' && list) kept += list;
    }
    if (kept.empty()) return {};
    const std::string given = "--cpu-bind=" + kept;
    if (!choose)
        return {CpuBindAction::refine,
                given + " (from --cpu-bind, or a --hint Slurm turned into it): each task is "
                        "bound by zenflow-bind to whole cores of its share (training CPUs; the "
                        "optimizer's in ZENFLOW_OPT_CPUS)"};
    if (asked)
        return {CpuBindAction::refuse,
                given + " and --zenflow-bind both choose the tasks' CPUs; give only one of them "
                        "(an exported SLURM_CPU_BIND counts as --cpu-bind: inside another step's "
                        "task it holds that task's mask; unset it, or give --cpu-bind=cores; see "
                        "zenflow_bind(8), --cpu-bind)"};
    return {CpuBindAction::defer, given + " given: this step keeps Slurm's binding (zenflow-bind, "
                                          "on by the site's default, stays off)"};
}

} // namespace zb::spank
