// How the trainer learns that its worker died: the worker's pidfd becomes readable when it exits,
// so a zero-timeout poll between bounded futex sleeps notices a death within one sleep slice.
#include "error.hpp"
#include "wait_deadline.hpp"
#include "worker_handle.hpp"
#include <zbproto/futex.hpp>
#include <zbproto/pidfd.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace zb::worker_client {

std::string describe_exit(int code, int status) {
    if (code == CLD_EXITED) return "exited with status " + std::to_string(status);
    std::string how =
        "was killed by signal " + std::to_string(status) + " (" + strsignal(status) + ")";
    if (code == CLD_DUMPED) how += ", core dumped";
    if (status == SIGKILL) how += "; the out-of-memory killer or a kill -9 does this";
    return how;
}

zb_status worker_error(int32_t status) {
    switch (status) {
    case ZB_EINVAL:
    case ZB_ENOMEM:
    case ZB_ESYS:
    case ZB_EINTERNAL:
        return static_cast<zb_status>(status);
    default:
        return ZB_EINTERNAL;
    }
}

} // namespace zb::worker_client

void zb_worker::check_alive() {
    if (reaped) zb::fail(ZB_EDEAD, death);
    pollfd p{pidfd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return;
    siginfo_t info{};
    std::string how;
    if (waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG) == 0 &&
        info.si_pid != 0) {
        how = zb::worker_client::describe_exit(info.si_code, info.si_status);
        if (info.si_code == CLD_EXITED) exit_code = info.si_status;
    } else
        how = "exited (its status was collected elsewhere)";
    reaped = true;
    in_flight = false;
    death = "the optimizer worker (pid " + std::to_string(pid) + ") " + how;
    zb::fail(ZB_EDEAD, death);
}

void zb_worker::publish_request() {
    ++seq;
    zb::proto::publish(ctl->req_seq, ctl->worker_sleeping, seq);
}

void zb_worker::wait_response(int64_t timeout_ns) {
    const uint32_t before = seq - 1;
    zb::WaitDeadline deadline(timeout_ns);
    // Liveness is checked between sleeps of at most this long.
    constexpr int64_t slice = 100'000'000;
    uint32_t done = deadline.bounded(std::min(wait_spin_ns, timeout_ns), [&](int64_t ask) {
        return zb::proto::spin_for_change(ctl->done_seq, before, ask);
    });
    while (done == before) {
        check_alive();
        const int64_t left = deadline.left();
        if (left <= 0) zb::fail(ZB_ETIMEDOUT, "the optimizer worker did not answer in time");
        done = deadline.bounded(std::min(left, slice), [&](int64_t ask) {
            return zb::proto::sleep_for_change(ctl->done_seq, ctl->trainer_sleeping, before, ask);
        });
    }
    if (done != seq)
        zb::fail(ZB_EINTERNAL, "the worker answered request " + std::to_string(done) +
                                   ", expected " + std::to_string(seq));
    const int32_t status = ctl->status;
    if (status != ZB_OK) {
        // Bounded: the worker may write the message while it is read.
        const char *m = ctl->message;
        zb::fail(zb::worker_client::worker_error(status),
                 std::string("optimizer worker: ") +
                     std::string(m, strnlen(m, zb::proto::kMessageSize)));
    }
}

void zb_worker::run_command() {
    publish_request();
    wait_response(static_cast<int64_t>(control_timeout_ms) * 1'000'000);
}

void zb_worker::run_state_command(const std::string &what) {
    try {
        run_command();
    } catch (const zb::Error &e) {
        if (e.status() != ZB_ETIMEDOUT) throw;
        const std::string why = "the optimizer worker did not " + what +
                                " within control_timeout_ms=" + std::to_string(control_timeout_ms) +
                                " and was stopped; spawn a new one with a longer timeout";
        stop(why);
        zb::fail(ZB_ETIMEDOUT, why);
    }
}

void zb_worker::await_exit(int64_t timeout_ns) const {
    const zb::WaitDeadline deadline(timeout_ns);
    pollfd p{pidfd, POLLIN, 0};
    for (int64_t left; (left = deadline.left()) > 0;)
        if (poll(&p, 1, static_cast<int>((left + 999'999) / 1'000'000)) >= 0 || errno != EINTR)
            return;
}

void zb_worker::check_gone() {
    await_exit(1'000'000'000);
    check_alive();
}

void zb_worker::stop(const std::string &why) {
    if (!reaped) {
        zb::proto::pidfd_send_signal(pidfd, SIGKILL);
        siginfo_t info{};
        // ECHILD if reaped elsewhere; a signal handler (Python's, without SA_RESTART) must not
        // leave it a zombie.
        while (waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED) != 0 && errno == EINTR) {
        }
    }
    reaped = true;
    in_flight = false;
    death = why;
}
