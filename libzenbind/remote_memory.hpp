// The worker's memory read and written from the trainer with process_vm_readv(2) and
// process_vm_writev(2): a group's moments go straight between where the worker keeps them and the
// caller's memory, with no segment of fresh shared pages between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <vector>

namespace zb::remote {

// `bytes` at address `remote` in the other process and at `local` in this one (null, when
// writing: zeros).
struct Piece {
    uint64_t remote;
    void *local;
    size_t bytes;
};

// Copies every piece from this process into process `pid` (write) or from it (read), on OpenMP's
// default thread count (a thread per 16 MiB at most). False when the system does not let this
// process reach pid's memory (EPERM, EACCES: Yama's ptrace_scope 2 or 3, or 1 and a pid that is
// not our descendant; ENOSYS: a seccomp filter or a kernel without cross-memory attach); what was
// copied then is unspecified. Throws zb::Error for anything else: ZB_EINVAL for memory that cannot
// be read or written (EFAULT), ZB_EDEAD for a process that is gone (ESRCH). The caller makes sure
// pid is still its worker: a child not yet reaped, whose pid no other process can take (a trainer
// whose children are reaped elsewhere, SIGCHLD ignored, is told so by check_alive first).
bool write(pid_t pid, const std::vector<Piece> &pieces);
bool read(pid_t pid, const std::vector<Piece> &pieces);

// The threads a copy of `bytes` of optimizer state runs on, here or through a segment: OpenMP's
// default count (under srun --zenflow-bind, the training CPUs), a thread per 16 MiB at most.
size_t copy_threads(size_t bytes);

} // namespace zb::remote
