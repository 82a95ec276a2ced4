// How a team of threads shares out the elements of one step. Each thread owns its adam_slice (so
// it updates the pages it first touched, on its own NUMA node) and takes that slice's chunks from
// the front; a thread whose own chunks are done takes the last untaken chunk of the thread with
// the most left. A thread that is descheduled, or slower (an SMT sibling busy, a smaller core),
// then holds the step back by at most a chunk, instead of by the rest of its slice.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zb::opt {

class TeamShare {
  public:
    static constexpr int kMaxThreads = 256;
    // Elements per chunk: ~1.8 MB of fp32 traffic, tens of microseconds, so a claim (one atomic
    // operation) costs nothing beside it and the last chunk of a step is short.
    static constexpr size_t kChunk = size_t{1} << 16;

    TeamShare() = default;
    TeamShare(const TeamShare &) = delete;
    TeamShare &operator=(const TeamShare &) = delete;

    // Whether a team of `threads` can share out `total` elements: at most kMaxThreads threads,
    // and each slice at most 2^24 - 1 chunks (about 2^40 elements). Teams that cannot keep their
    // static slices.
    static bool fits(size_t total, int threads);

    // Called by every thread of a team of `threads` once per step of `total` elements (fits()),
    // the same number of times by each, before its first claim. A thread may begin the next step
    // as soon as its claim() returned false, without waiting for the others; but a chunk another
    // thread claimed may still be in its hands, so the next step must not touch the same elements
    // before a barrier (the worker's groups are disjoint, and it passes one after each step).
    void begin(size_t total, int me, int threads);

    // Makes thread `me`'s next begin() give thread k the slice [bounds[k], bounds[k + 1]) of the
    // step's elements instead of its adam_slice (null: adam_slice again). A step that leaves
    // elements out (idle ranges) keeps each thread on the elements of the pages it first touched
    // this way: slices_skipping(). Every thread of the team passes the same `threads` + 1
    // ascending bounds, from 0 to the step's total, each slice within fits()'s limit; they must
    // outlive the step.
    void slice_next(int me, const size_t *bounds) { slots_[me].next_bounds = bounds; }

    // The bounds (threads + 1 of them) that give each thread the elements of its adam_slice of
    // `numel` elements that a step steps, when it leaves out the `count` ranges [skip[2 i],
    // skip[2 i + 1]) (sorted, disjoint, inside [0, numel)) and steps the others concatenated.
    static void slices_skipping(size_t numel, int threads, const size_t *skip, size_t count,
                                size_t *bounds);

    // Claims the next chunk for thread `me`: its own first, then another's. False when every
    // chunk of the step is claimed.
    bool claim(int me, size_t &lo, size_t &hi);

    // How many chunks thread `me` took from others in this step (tests, diagnostics).
    size_t stolen(int me) const { return slots_[me].stolen; }

  private:
    // A slot's state in one word: the step it belongs to (16 bits, compared modulo 2^16), then the
    // first and one past the last untaken chunk of its owner's slice (24 bits each, relative to
    // the slice: see fits()). A slot of an older step is opened by whoever touches it first,
    // owner or thief.
    // Every field but `state` is its owner's alone: what the owner's begin() was told, which
    // every thread of the team is told alike.
    struct alignas(64) Slot {
        std::atomic<uint64_t> state{0};
        uint32_t epoch = 0; // the owner's count of begin() calls
        size_t total = 0;
        int threads = 0;
        size_t stolen = 0;
        const size_t *bounds = nullptr;      // this step's slices (slice_next), or null
        const size_t *next_bounds = nullptr; // the next begin()'s
    };

    static void slice(const Slot &mine, int slot, size_t &lo, size_t &hi);
    uint64_t opened(int slot, const Slot &mine);
    bool take(int slot, const Slot &mine, bool front, size_t &lo, size_t &hi);

    Slot slots_[kMaxThreads];
};

} // namespace zb::opt
