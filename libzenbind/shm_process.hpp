// pidfd_open through syscall(2): glibc 2.36's <sys/pidfd.h> lacks C linkage for C++ callers.
// Both ends of the worker protocol watch their peer through a pidfd.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace zb::shm {

inline int pidfd_open(pid_t pid) {
    return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

} // namespace zb::shm
