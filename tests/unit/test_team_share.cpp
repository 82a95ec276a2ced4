// TeamShare: every element of a step is claimed exactly once, by whatever mix of owners and
// thieves; steps follow each other on one TeamShare without a barrier; a thread that falls behind
// has its chunks taken by the others.
#include <zbadam/team_share.hpp>

#include <zbadam/adam.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

using zb::opt::TeamShare;
constexpr size_t kChunk = TeamShare::kChunk;

// Runs `steps` steps of `total` elements with `threads` threads, no barrier between steps, and
// counts how often each element of each step was claimed; `late` sleeps before its first step.
// Returns the counts, [step * total + element], and the chunks each thread stole in the last step.
// With `bounds` (TeamShare::slice_next), thread k's own slice is [bounds[k], bounds[k + 1]).
std::vector<unsigned> run(size_t total, int threads, int steps, int late,
                          std::vector<size_t> &stolen, std::vector<size_t> &own,
                          const size_t *bounds = nullptr) {
    std::vector<std::atomic<unsigned>> hits(total * static_cast<size_t>(steps));
    TeamShare share;
    std::atomic<bool> bad{false};
    stolen.assign(static_cast<size_t>(threads), 0);
    own.assign(static_cast<size_t>(threads), 0);
    // Plain threads: TeamShare needs no OpenMP (and libomp's thread pool reads as a leak to
    // LeakSanitizer).
    const auto thread = [&](int me) {
        if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        for (int s = 0; s < steps; ++s) {
            share.slice_next(me, bounds);
            share.begin(total, me, threads);
            size_t lo, hi, mine_lo, mine_hi, claimed = 0;
            zb::opt::adam_slice(total, me, threads, mine_lo, mine_hi);
            if (bounds) {
                mine_lo = bounds[me];
                mine_hi = bounds[me + 1];
            }
            while (share.claim(me, lo, hi)) {
                if (lo >= hi || hi > total || (!bounds && lo % 16 && lo != 0)) {
                    bad.store(true);
                    return;
                }
                for (size_t i = lo; i < hi; ++i)
                    hits[static_cast<size_t>(s) * total + i].fetch_add(1);
                if (lo >= mine_lo && hi <= mine_hi) claimed += hi - lo;
            }
            if (s == steps - 1) {
                stolen[static_cast<size_t>(me)] = share.stolen(me);
                own[static_cast<size_t>(me)] = claimed;
            }
        }
    };
    std::vector<std::thread> team;
    for (int me = 0; me < threads; ++me)
        team.emplace_back(thread, me);
    for (std::thread &t : team)
        t.join();
    if (bad.load()) fail_msg("a claim outside [0, %zu) or off a 16-element boundary", total);
    std::vector<unsigned> out;
    for (auto &h : hits)
        out.push_back(h.load());
    return out;
}

void test_every_element_once(void **) {
    for (size_t total : {size_t{0}, size_t{1}, size_t{15}, kChunk, 3 * kChunk + 17, 11 * kChunk})
        for (int threads = 1; threads <= 5; ++threads) {
            std::vector<size_t> stolen, own;
            const auto hits = run(total, threads, 7, -1, stolen, own);
            for (size_t i = 0; i < hits.size(); ++i)
                if (hits[i] != 1)
                    fail_msg("%d threads, %zu elements: step %zu element %zu claimed %u times",
                             threads, total, i / (total ? total : 1), i % (total ? total : 1),
                             hits[i]);
        }
}

void test_late_thread_is_helped(void **) {
    const size_t total = 3 * 40 * kChunk;
    std::vector<size_t> stolen, own;
    const auto hits = run(total, 3, 1, 0, stolen, own);
    for (unsigned h : hits)
        assert_int_equal(h, 1);
    size_t slice_lo, slice_hi;
    zb::opt::adam_slice(total, 0, 3, slice_lo, slice_hi);
    // The two others finish their own 40 chunks long before thread 0 wakes, then take its chunks.
    assert_true(stolen[1] + stolen[2] > 0);
    assert_true(own[0] < slice_hi - slice_lo);
    assert_int_equal(stolen[0], 0);
}

// A step that leaves out idle ranges steps the rest concatenated: each thread's own slice of them
// must hold the elements of its adam_slice of the whole group (the pages it first touched), not
// the concatenation's adam_slice, which moves every slice by the idle elements before it.
void test_slices_skipping_follow_first_touch(void **) {
    size_t bounds[6];
    const size_t front[] = {0, 500};
    TeamShare::slices_skipping(1000, 2, front, 1, bounds); // slices [0, 496) and [496, 1000)
    assert_int_equal(bounds[0], 0);
    assert_int_equal(bounds[1], 0); // thread 0's slice is all idle: it owns nothing
    assert_int_equal(bounds[2], 500);
    const size_t two[] = {100, 200, 600, 700};
    TeamShare::slices_skipping(1000, 2, two, 2, bounds);
    assert_int_equal(bounds[1], 396);
    assert_int_equal(bounds[2], 800);

    // Every element that is stepped, at its place in the concatenation, belongs to the thread that
    // first touched it, for ranges that straddle slice boundaries, begin or end the group.
    unsigned seed = 12345;
    const auto next = [&seed](size_t n) {
        seed = seed * 1103515245u + 12345u;
        return static_cast<size_t>(seed >> 8) % n;
    };
    for (int round = 0; round < 300; ++round) {
        const size_t numel = 1 + next(5000);
        const int threads = 1 + static_cast<int>(next(5));
        std::vector<size_t> skip;
        for (size_t at = next(200); at < numel; at += 1 + next(600)) {
            const size_t end = std::min(numel, at + 1 + next(400));
            skip.push_back(at);
            skip.push_back(end);
            at = end;
        }
        TeamShare::slices_skipping(numel, threads, skip.data(), skip.size() / 2, bounds);
        size_t pos = 0, r = 0;
        for (size_t e = 0; e < numel; ++e) {
            while (r < skip.size() / 2 && skip[2 * r + 1] <= e)
                ++r;
            if (r < skip.size() / 2 && skip[2 * r] <= e) continue; // idle
            int owner = 0;
            for (int k = 0; k < threads; ++k) {
                size_t lo, hi;
                zb::opt::adam_slice(numel, k, threads, lo, hi);
                if (e >= lo && e < hi) owner = k;
            }
            if (pos < bounds[owner] || pos >= bounds[owner + 1])
                fail_msg("%zu elements, %d threads: element %zu (stepped as %zu) is thread %d's, "
                         "whose slice is [%zu, %zu)",
                         numel, threads, e, pos, owner, bounds[owner], bounds[owner + 1]);
            ++pos;
        }
        assert_int_equal(bounds[0], 0);
        assert_int_equal(bounds[threads], pos);
    }
}

// Slices given by slice_next, of any length (empty ones too): every element still claimed once,
// each thread's own chunks inside its slice, a late thread's taken by the others.
void test_given_slices(void **) {
    const size_t total = 7 * kChunk + 1000;
    const size_t bounds[] = {0, 0, 3 * kChunk + 5, 3 * kChunk + 5, total};
    for (int late : {-1, 1}) {
        std::vector<size_t> stolen, own;
        const auto hits = run(total, 4, 5, late, stolen, own, bounds);
        for (size_t i = 0; i < hits.size(); ++i)
            if (hits[i] != 1) fail_msg("element %zu claimed %u times", i, hits[i]);
        size_t claimed = 0;
        for (size_t c : own)
            claimed += c;
        assert_true(claimed <= total);
        assert_int_equal(own[0], 0);
        assert_int_equal(own[2], 0);
    }
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_element_once),
        cmocka_unit_test(test_late_thread_is_helped),
        cmocka_unit_test(test_slices_skipping_follow_first_touch),
        cmocka_unit_test(test_given_slices),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
