// Cross-process futex on a word of a MAP_SHARED mapping (hence no FUTEX_PRIVATE_FLAG), and the
// spin-then-sleep wait both sides use: a short busy wait catches a peer that answers within
// microseconds, the futex sleep keeps an idle side off the CPU, and every sleep is bounded so the
// caller can check liveness and its deadline between sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace zb::proto {

inline void futex_wake(uint32_t *word) {
    syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Sleeps while *word == expected, at most timeout_ns; spurious returns are fine for callers.
inline void futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    timespec ts{static_cast<time_t>(timeout_ns / 1000000000),
                static_cast<long>(timeout_ns % 1000000000)};
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Spins up to spin_ns for *word != seen; returns the new value or `seen` if it did not change.
inline uint32_t spin_for_change(uint32_t &word, uint32_t seen, int64_t spin_ns) {
    std::atomic_ref<uint32_t> w(word);
    uint32_t v = w.load(std::memory_order_acquire);
    if (v != seen || spin_ns <= 0) return v;
    const int64_t until = now_ns() + spin_ns;
    for (unsigned i = 0;; ++i) {
        v = w.load(std::memory_order_acquire);
        if (v != seen) return v;
        cpu_relax();
        if ((i & 63) == 63 && now_ns() >= until) return v;
    }
}

// One bounded sleep on *word while it equals `seen`, announcing it through *sleeping so that the
// peer knows to call futex_wake (seq_cst on both sides: either the peer sees the flag, or this
// side sees the new value before sleeping).
inline uint32_t sleep_for_change(uint32_t &word, uint32_t &sleeping, uint32_t seen,
                                 int64_t timeout_ns) {
    std::atomic_ref<uint32_t> w(word), s(sleeping);
    s.store(1, std::memory_order_seq_cst);
    uint32_t v = w.load(std::memory_order_seq_cst);
    if (v == seen) futex_wait(&word, seen, timeout_ns);
    s.store(0, std::memory_order_relaxed);
    return w.load(std::memory_order_acquire);
}

// Publishes `value` in *word and wakes the peer if it announced a sleep.
inline void publish(uint32_t &word, uint32_t &sleeping, uint32_t value) {
    std::atomic_ref<uint32_t> w(word), s(sleeping);
    w.store(value, std::memory_order_seq_cst);
    if (s.load(std::memory_order_seq_cst)) futex_wake(&word);
}

} // namespace zb::proto
