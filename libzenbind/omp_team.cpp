#include "omp_team.hpp"

#include <unistd.h>

#include <atomic>

namespace zb {
namespace {

// The process that last ran a team here; a fork copies it into the child, whose pid differs.
std::atomic<pid_t> team_process{0};

} // namespace

int team_threads(int wanted) {
    if (wanted <= 1) return 1;
    const pid_t me = getpid(), owner = team_process.load(std::memory_order_relaxed);
    if (owner != 0 && owner != me) return 1;
    team_process.store(me, std::memory_order_relaxed);
    return wanted;
}

} // namespace zb
