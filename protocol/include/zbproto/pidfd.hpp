// pidfd_open and pidfd_send_signal through syscall(2): glibc 2.36's <sys/pidfd.h> lacks C
// linkage for C++ callers. Both ends of the worker protocol watch their peer through a pidfd, and
// the trainer signals its worker only through one: a pid may already be reaped and reused.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace zb::proto {

inline int pidfd_open(pid_t pid) {
    return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

inline int pidfd_send_signal(int pidfd, int sig) {
    return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

} // namespace zb::proto
