// The CPUs a process may run on, as the kernel says (sched_getaffinity), on machines of any size.
#pragma once

#include <hwloc.h>
#include <sys/types.h>

namespace zb {

// pid 0: the caller. Fails (zb::fail) only if the kernel refuses.
void process_affinity(pid_t pid, hwloc_bitmap_t out);

// The CPUs the calling process was given: its affinity, or where OpenMP binds threads
// (OMP_PROC_BIND other than false, OMP_PLACES, GOMP_CPU_AFFINITY) the CPUs of OpenMP's places,
// which it made from the affinity the process started with before it pinned the initial thread
// to the first of them (before main()). Fails as process_affinity().
void caller_cpus(hwloc_bitmap_t out);

} // namespace zb
