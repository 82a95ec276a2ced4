// The CPUs this benchmark process may run on, read once so it can pin threads and restore itself.
#pragma once

#include <sched.h>

#include <vector>

struct Affinity {
    cpu_set_t mask;
    std::vector<int> cpus; // increasing
};

// False only if sched_getaffinity fails (errno says why).
inline bool read_affinity(Affinity &a) {
    if (sched_getaffinity(0, sizeof a.mask, &a.mask) != 0) return false;
    a.cpus.clear();
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &a.mask)) a.cpus.push_back(c);
    return true;
}
