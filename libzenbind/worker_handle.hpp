// The trainer side of one worker: its control segment, group segments, process and socket.
#pragma once

#include "shm_segment.hpp"

#include <zbproto/layout.hpp>
#include <zenbind/worker.h>

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <unistd.h>
#include <vector>

struct zb_worker {
    zb::shm::Segment control;
    zb::proto::Header *header = nullptr;
    zb::proto::Control *ctl = nullptr;
    zb::shm::Arena group_memory{"zenflow parameter groups"}; // before groups: it outlives them
    std::vector<zb::shm::Region> groups;
    std::vector<uint64_t> moments; // each group's moments' address in the worker
    // Each group's descriptor and the thread count as this side wrote them: the worker can write
    // the control block too, so sizes and offsets are never read back from it.
    std::vector<zb::proto::GroupDesc> descs;
    unsigned nthreads = 0;
    std::vector<int> mems;
    pid_t owner = -1; // the process that spawned the worker; a forked child only reads its copy
    pid_t pid = -1;
    int pidfd = -1;
    int sock = -1;
    uint32_t seq = 0;       // last request published
    bool in_flight = false; // a step was submitted and not yet waited for
    bool reaped = false;    // the worker process is gone (death holds why)
    std::string death;
    int exit_code = -1; // the worker's exit code once reaped, -1 if a signal or unknown
    int64_t wait_spin_ns = 0;
    unsigned control_timeout_ms = 0;

    ~zb_worker();

    // This is a forked child's copy of the handle: its segments are copy-on-write (shm_fork.hpp),
    // and nothing it does may reach the worker, which is the owner's. Only the owner's calls talk
    // to the worker and only its destroy stops it; a child's destroy frees its copy.
    bool forked() const { return owner != getpid(); }

    // Throws ZB_EDEAD (saying how it died) if the worker process has exited.
    void check_alive();
    // Publishes the request already written in ctl.
    void publish_request();
    // Waits for the response to the last request, up to timeout_ns; throws ZB_ETIMEDOUT or
    // ZB_EDEAD, or the worker's own error status with its message.
    void wait_response(int64_t timeout_ns);
    // publish_request + wait_response(control_timeout_ms).
    void run_command();
    // run_command for a command that changes the worker's state: past control_timeout_ms the
    // worker may still complete it after the trainer gave up, and both sides would disagree from
    // then on, so the worker is stopped (ZB_ETIMEDOUT naming `what`, later calls ZB_EDEAD).
    void run_state_command(const std::string &what);
    // Waits until the worker process has exited (its pidfd readable), at most timeout_ns; a
    // signal handler's interruption (Python's, without SA_RESTART) waits on for the time left.
    void await_exit(int64_t timeout_ns) const;
    // A call found the worker's end gone (its socket closed, its memory unreachable): throws
    // ZB_EDEAD saying how it died once its pidfd says so (1 s at most); returns if it lives.
    void check_gone();
    // SIGKILLs the worker through its pidfd and reaps it; later calls give ZB_EDEAD with `why`.
    void stop(const std::string &why);
};

namespace zb::worker_client {

// "exited with status N", "was killed by signal 9 (Killed)": from a waitid() result.
std::string describe_exit(int code, int status);

// The error the worker reported in Control::status: one it can report, else ZB_EINTERNAL (a
// worker that answers garbage, or ZB_OK with a failure).
zb_status worker_error(int32_t status);

// The handle of a state command (reading or writing a group's state, its ranges, removing it):
// the caller's own, the worker alive, no step in flight, `group` registered; else throws,
// naming `fn`.
zb_worker &state_handle(zb_worker *worker, unsigned group, const char *fn);
// Queues a segment's fd for the worker; the caller publishes the command that takes it next.
void send_segment(zb_worker &w, int fd, uint32_t tag, const char *what);

} // namespace zb::worker_client
