// The prefetch mode the kernels run with: what force_prefetch() fixed, or the run-time choice
// between none and L2, made by timing whole large calls of the process in each mode (adam.hpp).
#include "prefetch_choice.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

namespace zb::opt {
namespace {

std::atomic<Prefetch> &requested() {
    static std::atomic<Prefetch> where{Prefetch::automatic};
    return where;
}

// The run-time choice: off or l2 once made, automatic before.
std::atomic<Prefetch> &chosen() {
    static std::atomic<Prefetch> mode{Prefetch::automatic};
    return mode;
}

// Why whole calls, and pairs of calls in a row: one chunk or a few of each mode in turn measure
// another memory system than a step in one mode does. On an AMD EPYC (Zen 5) guest, steps all
// prefetching into L2 took 1.09-1.11x the time of steps without (zenflow-bench adam
// --vs-prefetch, 100M fp32, one thread), while single chunks in turn timed 1.00-1.02x (the
// medians of 32 pairs; the former choice, from the medians of 8 single chunks each way, kept L2
// in 1 run of 4) and blocks of 16 chunks 1.01-1.09x. Two calls in a row see the same machine;
// calls far apart (or the first chunk of a call, up to 2.5x slower) may not. And two calls of
// one kind: the worker steps its groups one call each, and two groups of other gradient types or
// sizes differ in cost by more than the prefetch does (a pair across two kinds kept L2 in 7 runs
// of 8 where it cost 1.11x and 0.99x on each).
struct Calibration {
    std::mutex lock;
    const void *owner = nullptr; // the thread that timed the pair's first call, once timed
    Kind kind{};
    uint64_t first_call = 0;
    double first = 0; // its seconds per element
    int taken = 0;
    int attempts = 0;                 // large calls timed or not, for kMaxAttempts
    double ratios[kCalibrationPairs]; // l2 over off, per pair
};

// L2 is kept only where its calls took under this fraction of the time of calls without: where
// the two are within the noise (two threads on that Zen 5 guest: steps with L2 took 0.995-1.07x
// the time of steps without in four paired runs, where the medians of five pairs of calls came
// to 0.986-1.063, three of six below 1), the hardware prefetchers alone are the simpler default;
// where L2 pays, it paid far more (0.65-0.81x the time on a Zen 4 guest).
constexpr double kTakeL2Below = 0.97;

Calibration &calibration() {
    static Calibration c;
    return c;
}

// Each thread's count of the large calls of each kind it began while the choice was being made
// (the last few kinds it saw). Every thread of a team begins the same calls, so the counts agree
// without the threads waiting for each other (a thread may begin the next call while the first
// thread still runs its last chunk); where they do not (a team that changed size), a call's
// threads run in both modes, which costs the choice its accuracy, never a result.
struct Sequence {
    Kind kind{};
    uint64_t calls = 0;
};
constexpr int kKinds = 4;
thread_local Sequence sequences[kKinds];
thread_local int next_slot = 0;

bool same(const Kind &a, const Kind &b) {
    return a.total == b.total && a.grad == b.grad && a.copy == b.copy && a.stale == b.stale &&
           a.tensors == b.tensors;
}

// The mode of a call: off then l2 in even pairs, l2 then off in odd ones.
Prefetch mode_of(uint64_t call) {
    return (call % 2 == 1) != (call / 2 % 2 == 1) ? Prefetch::l2 : Prefetch::off;
}

double median_of(double *v, int n) {
    std::sort(v, v + n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A call's sample into c: the first of a pair kept, the second's ratio to it taken.
void take_sample(Calibration &c, const Kind &kind, uint64_t call, size_t elements, double seconds) {
    const void *me = &next_slot; // (this thread's own)
    if (elements == 0 || seconds <= 0) {
        c.owner = nullptr; // (its pair is incomplete)
        return;
    }
    const double per_element = seconds / static_cast<double>(elements);
    if (call % 2 == 0) {
        c.owner = me;
        c.kind = kind;
        c.first_call = call;
        c.first = per_element;
        return;
    }
    if (c.owner != me || !same(c.kind, kind) || c.first_call != call - 1) return;
    c.owner = nullptr;
    c.ratios[c.taken++] =
        mode_of(call) == Prefetch::l2 ? per_element / c.first : c.first / per_element;
}

} // namespace

bool timed_kind(const Kind &kind, int threads) {
    // (each thread's own slice at least 2 x 8 chunks: the first thread times 8 or more, unless
    // others take most of its slice)
    return kind.total >= kCalibrationMinimum && TeamShare::fits(kind.total, threads) &&
           kind.total / static_cast<size_t>(threads) >= 16 * TeamShare::kChunk;
}

Prefetch call_prefetch(const Kind &kind, int threads, uint64_t &call) {
    call = UINT64_MAX;
    const Prefetch p = requested().load(std::memory_order_relaxed);
    if (p != Prefetch::automatic) return p;
    const Prefetch made = chosen().load(std::memory_order_relaxed);
    if (made != Prefetch::automatic) return made;
    if (!timed_kind(kind, threads)) return Prefetch::off;
    Sequence *seq = nullptr;
    for (Sequence &s : sequences)
        if (s.calls && same(s.kind, kind)) seq = &s;
    if (!seq) {
        seq = &sequences[next_slot];
        next_slot = (next_slot + 1) % kKinds;
        *seq = Sequence{kind, 0};
    }
    call = seq->calls++;
    return mode_of(call);
}

void record_call(const Kind &kind, uint64_t call, size_t elements, double seconds) noexcept {
    if (call == UINT64_MAX) return;
    Calibration &c = calibration();
    const std::unique_lock<std::mutex> hold(c.lock, std::try_to_lock); // (lock() may throw)
    if (!hold.owns_lock()) return;
    if (chosen().load(std::memory_order_relaxed) != Prefetch::automatic) return;
    take_sample(c, kind, call, elements, seconds);
    if (c.taken == kCalibrationPairs) {
        const double l2_over_off = median_of(c.ratios, kCalibrationPairs);
        chosen().store(l2_over_off < kTakeL2Below ? Prefetch::l2 : Prefetch::off,
                       std::memory_order_relaxed);
    } else if (++c.attempts == kMaxAttempts) { // never enough whole pairs: the hardware's
        chosen().store(Prefetch::off, std::memory_order_relaxed); // prefetchers alone
    }
}

void force_prefetch(Prefetch p) {
    requested().store(p, std::memory_order_relaxed);
}

Prefetch requested_prefetch() {
    return requested().load(std::memory_order_relaxed);
}

Prefetch active_prefetch() {
    uint64_t unused;
    return call_prefetch(Kind{}, 1, unused);
}

Prefetch chosen_prefetch() {
    return chosen().load(std::memory_order_relaxed);
}

const char *prefetch_name(Prefetch p) {
    switch (p) {
    case Prefetch::off:
        return "off";
    case Prefetch::l1:
        return "l1";
    case Prefetch::l2:
        return "l2";
    case Prefetch::automatic:
        return "auto";
    }
    return "unknown";
}

} // namespace zb::opt
