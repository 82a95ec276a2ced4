#include <zbadam/team_share.hpp>

#include <zbadam/adam.hpp>

namespace zb::opt {
namespace {

constexpr uint64_t kField = (uint64_t{1} << 24) - 1;

uint64_t pack(uint64_t epoch, uint64_t front, uint64_t back) {
    return (epoch & 0xffff) << 48 | front << 24 | back;
}
uint64_t epoch_of(uint64_t s) {
    return s >> 48;
}
uint64_t front_of(uint64_t s) {
    return (s >> 24) & kField;
}
uint64_t back_of(uint64_t s) {
    return s & kField;
}

size_t chunks_of(size_t lo, size_t hi) {
    return (hi - lo + TeamShare::kChunk - 1) / TeamShare::kChunk;
}

} // namespace

bool TeamShare::fits(size_t total, int threads) {
    if (threads < 1 || threads > kMaxThreads) return false;
    size_t lo, hi;
    adam_slice(total, 0, threads, lo, hi); // slices differ by at most 16 elements
    return chunks_of(lo, hi + 16) <= kField;
}

void TeamShare::slices_skipping(size_t numel, int threads, const size_t *skip, size_t count,
                                size_t *bounds) {
    size_t r = 0, skipped = 0; // the ranges wholly before x, and their elements
    for (int k = 0; k <= threads; ++k) {
        size_t x = numel, unused;
        if (k < threads) adam_slice(numel, k, threads, x, unused);
        for (; r < count && skip[2 * r + 1] <= x; ++r)
            skipped += skip[2 * r + 1] - skip[2 * r];
        const size_t inside = r < count && skip[2 * r] < x ? x - skip[2 * r] : 0;
        bounds[k] = x - skipped - inside;
    }
}

void TeamShare::begin(size_t total, int me, int threads) {
    Slot &s = slots_[me];
    ++s.epoch;
    s.total = total;
    s.threads = threads;
    s.stolen = 0;
    s.bounds = s.next_bounds;
    s.next_bounds = nullptr;
}

void TeamShare::slice(const Slot &mine, int slot, size_t &lo, size_t &hi) {
    if (mine.bounds) {
        lo = mine.bounds[slot];
        hi = mine.bounds[slot + 1];
    } else {
        adam_slice(mine.total, slot, mine.threads, lo, hi);
    }
}

// The slot's state in this step, opening it (all its chunks untaken) if it still holds an older
// step's: whoever comes first, its owner or a thief, opens it, and only once. A slot already in a
// later step has nothing left of this one (its owner only moves on once every chunk of this step
// is claimed), so a team may run several steps in a row on one TeamShare with no barrier between.
uint64_t TeamShare::opened(int slot, const Slot &mine) {
    const uint32_t epoch = mine.epoch;
    uint64_t s = slots_[slot].state.load(std::memory_order_acquire);
    for (;;) {
        const auto ahead = static_cast<int16_t>(static_cast<uint16_t>(epoch_of(s) - epoch));
        if (ahead > 0) return pack(epoch, 0, 0);
        if (ahead == 0) return s;
        size_t lo, hi;
        slice(mine, slot, lo, hi);
        const uint64_t fresh = pack(epoch, 0, chunks_of(lo, hi));
        if (slots_[slot].state.compare_exchange_weak(s, fresh, std::memory_order_acq_rel))
            return fresh;
    }
}

bool TeamShare::take(int slot, const Slot &mine, bool front, size_t &lo, size_t &hi) {
    uint64_t s = opened(slot, mine);
    for (;;) {
        const uint64_t f = front_of(s), b = back_of(s);
        if (f >= b) return false;
        const uint64_t next = front ? pack(mine.epoch, f + 1, b) : pack(mine.epoch, f, b - 1);
        if (slots_[slot].state.compare_exchange_weak(s, next, std::memory_order_acq_rel)) {
            size_t first, end;
            slice(mine, slot, first, end);
            const size_t chunk = front ? f : b - 1;
            lo = first + chunk * kChunk;
            hi = lo + kChunk < end ? lo + kChunk : end;
            return true;
        }
        if (epoch_of(s) != (mine.epoch & 0xffff)) return false; // its owner has moved on
    }
}

bool TeamShare::claim(int me, size_t &lo, size_t &hi) {
    Slot &mine = slots_[me];
    if (take(me, mine, true, lo, hi)) return true;
    for (;;) {
        int richest = -1;
        uint64_t most = 0;
        for (int k = 0; k < mine.threads; ++k) {
            if (k == me) continue;
            const uint64_t s = opened(k, mine);
            const uint64_t left = back_of(s) - front_of(s);
            if (front_of(s) < back_of(s) && left > most) {
                most = left;
                richest = k;
            }
        }
        if (richest < 0) return false;
        if (take(richest, mine, false, lo, hi)) {
            ++mine.stolen;
            return true;
        }
    }
}

} // namespace zb::opt
