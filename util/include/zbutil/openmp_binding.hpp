// Whether OpenMP binds this process's threads (OMP_PROC_BIND other than false, OMP_PLACES or
// GOMP_CPU_AFFINITY set): libgomp then pins the initial thread to its first place before main(),
// so the process's affinity is no longer the CPUs it was given. Header-only: only what links
// OpenMP includes it (never the SPANK plugin).
#pragma once

#include <omp.h>

namespace zb::util {

inline bool openmp_binds() {
    return omp_get_proc_bind() != omp_proc_bind_false;
}

// What a tool that reads or measures this machine tells a user it refuses under that binding.
inline constexpr const char *kOpenmpBindingHelp =
    "OpenMP binds this process (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY is set)";
inline constexpr const char *kOpenmpUnbindHelp =
    "run it with env -u OMP_PROC_BIND -u OMP_PLACES -u GOMP_CPU_AFFINITY";

} // namespace zb::util
