// The CPUs a process may run on, as the kernel says (sched_getaffinity), on machines of any size.
#pragma once

#include <hwloc.h>
#include <sys/types.h>

namespace zb {

// pid 0: the caller. Fails (zb::fail) only if the kernel refuses.
void process_affinity(pid_t pid, hwloc_bitmap_t out);

} // namespace zb
