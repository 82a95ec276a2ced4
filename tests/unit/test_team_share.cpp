// TeamShare: every element of a step is claimed exactly once, by whatever mix of owners and
// thieves; steps follow each other on one TeamShare without a barrier; a thread that falls behind
// has its chunks taken by the others.
#include <zbadam/team_share.hpp>

#include <zbadam/adam.hpp>

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
std::vector<unsigned> run(size_t total, int threads, int steps, int late,
                          std::vector<size_t> &stolen, std::vector<size_t> &own) {
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
            share.begin(total, me, threads);
            size_t lo, hi, mine_lo, mine_hi, claimed = 0;
            zb::opt::adam_slice(total, me, threads, mine_lo, mine_hi);
            while (share.claim(me, lo, hi)) {
                if (lo >= hi || hi > total || (lo % 16 && lo != 0)) {
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

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_element_once),
        cmocka_unit_test(test_late_thread_is_helped),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
