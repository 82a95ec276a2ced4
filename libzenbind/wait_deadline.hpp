// The time limit of a wait for the worker, which stands still while this process is stopped
// (SIGSTOP, Ctrl-Z, Slurm suspending the job, which stops or freezes the worker with it): the time
// a bounded wait took past what it asked for moves the deadline on, so a job resumed after its
// timeout is not taken for one with a hung worker. A scheduling delay counts the same way, and
// only makes the limit more lenient.
#pragma once

#include <zbproto/futex.hpp>

#include <algorithm>
#include <cstdint>

namespace zb {

class WaitDeadline {
  public:
    explicit WaitDeadline(int64_t timeout_ns)
        : at_(proto::now_ns() + std::max<int64_t>(timeout_ns, 0)) {}

    // Nanoseconds left (<= 0: the limit is reached).
    int64_t left() const { return at_ - proto::now_ns(); }

    // wait(ask), a wait bounded by ask nanoseconds; what it took past ask is not counted.
    template <class Wait> auto bounded(int64_t ask, Wait &&wait) {
        const int64_t start = proto::now_ns();
        auto result = wait(ask);
        at_ += std::max<int64_t>(proto::now_ns() - start - ask, 0);
        return result;
    }

  private:
    int64_t at_;
};

} // namespace zb
