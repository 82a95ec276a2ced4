// Writes into the worker's memory from the trainer with process_vm_writev(2): a checkpoint's
// moments go straight to where the worker keeps them, with no segment of fresh pages between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <vector>

namespace zb::remote {

// `bytes` from `from` (null: zeros) to address `to` in the other process.
struct Piece {
    uint64_t to;
    const void *from;
    size_t bytes;
};

// Writes every piece into process `pid`, in order. False, with nothing written, when the system
// does not let this process write into pid's memory (EPERM, EACCES: Yama's ptrace_scope 2 or 3, a
// pid that is not our child; ENOSYS: a seccomp filter or a kernel without cross-memory attach).
// Throws zb::Error for anything else: ZB_EINVAL for memory of ours that cannot be read (EFAULT),
// ZB_EDEAD for a process that is gone (ESRCH).
bool write(pid_t pid, const std::vector<Piece> &pieces);

} // namespace zb::remote
