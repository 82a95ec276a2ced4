// The worker's gradient pre-pass: each block's statistics are exactly the documented computation
// (g * scale rounded to fp32, squared in double into lane i % 8, lanes added in a fixed order), the
// same bits on every ISA level this CPU runs, non-finite elements counted after the scale, and
// partial blocks and tails handled.
#include <zbadam/adam_convert.hpp>
#include <zbadam/grad_stats.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

using zb::opt::GradStats;
using zb::opt::GradType;

float to_float(const std::vector<uint16_t> &h, size_t i, GradType type) {
    if (type == GradType::bf16) {
        const uint32_t u = uint32_t(h[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    return zb::opt::detail::f16_to_float(h[i]);
}

// The documented computation, one element at a time.
GradStats reference(const void *grad, GradType type, size_t lo, size_t hi, float scale) {
    double lane[8] = {};
    GradStats s;
    for (size_t i = lo; i < hi; ++i) {
        float g;
        if (type == GradType::f32) {
            g = static_cast<const float *>(grad)[i];
        } else {
            uint16_t h = static_cast<const uint16_t *>(grad)[i];
            std::vector<uint16_t> one{h};
            g = to_float(one, 0, type);
        }
        const float x = g * scale;
        lane[(i - lo) % 8] += double(x) * double(x);
        s.nonfinite += !std::isfinite(x);
    }
    s.sum_squares =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    return s;
}

// Random values over the whole range of each type: subnormals, tiny and huge numbers, both signs.
std::vector<uint32_t> random_words(size_t n, uint32_t seed) {
    std::vector<uint32_t> w(n);
    for (auto &v : w) {
        seed = seed * 1664525u + 1013904223u;
        v = seed;
    }
    return w;
}

void check_levels(const void *grad, GradType type, size_t lo, size_t hi, float scale) {
    const GradStats want = reference(grad, type, lo, hi, scale);
    int levels = 0;
    for (int level : {1, 3, 4}) {
        const zb::opt::GradBlockStatsFn fn = zb::opt::grad_block_stats_for_level(level);
        if (!fn) continue;
        ++levels;
        const GradStats got = fn(grad, type, lo, hi, scale);
        if (got.nonfinite != want.nonfinite)
            fail_msg("level %d, type %d, [%zu, %zu): %llu non-finite, want %llu", level, int(type),
                     lo, hi, (unsigned long long)got.nonfinite, (unsigned long long)want.nonfinite);
        if (std::isnan(want.sum_squares)) {
            assert_true(std::isnan(got.sum_squares)); // NaN payloads may differ
        } else if (std::memcmp(&got.sum_squares, &want.sum_squares, sizeof(double)) != 0) {
            fail_msg("level %d, type %d, [%zu, %zu): sum %.17g, want %.17g", level, int(type), lo,
                     hi, got.sum_squares, want.sum_squares);
        }
    }
    assert_true(levels >= 1);
}

void test_finite_every_level(void **) {
    const size_t n = 65536 + 37;
    std::vector<uint32_t> w = random_words(n, 7);
    std::vector<float> f32(n);
    std::vector<uint16_t> h16(n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t u = w[i] & 0xbfffffffu; // exponent never all ones: finite
        std::memcpy(&f32[i], &u, 4);
        f32[i] *= 0x1p-60f;               // keep squares and the scale inside fp32
        h16[i] = uint16_t(w[i] & 0xbfff); // finite in both bf16 and fp16
    }
    const size_t bounds[][2] = {{0, 1}, {0, 7}, {0, 8}, {3, 20}, {0, 65536}, {65536, n}, {5, n}};
    for (const auto &b : bounds) {
        check_levels(f32.data(), GradType::f32, b[0], b[1], 0.37f);
        check_levels(h16.data(), GradType::bf16, b[0], b[1], 0.37f);
        check_levels(h16.data(), GradType::f16, b[0], b[1], 0.37f);
    }
}

// Infinities, NaNs, and finite values that overflow once scaled are counted; the sum is not
// finite then.
void test_nonfinite_counted_after_scale(void **) {
    std::vector<float> f32(100, 1.0f);
    f32[3] = INFINITY;
    f32[50] = NAN;
    f32[99] = 3e38f; // finite, but not after * 2
    check_levels(f32.data(), GradType::f32, 0, 100, 2.0f);
    assert_int_equal(zb::opt::grad_block_stats(f32.data(), GradType::f32, 0, 100, 2.0f).nonfinite,
                     3);
    assert_int_equal(zb::opt::grad_block_stats(f32.data(), GradType::f32, 0, 99, 1.0f).nonfinite,
                     2);
    std::vector<uint16_t> h(20, 0x3c00); // 1.0 in fp16
    h[7] = 0x7c00;                       // +inf
    h[19] = 0xfe00;                      // NaN
    check_levels(h.data(), GradType::f16, 0, 20, 1.0f);
    assert_int_equal(zb::opt::grad_block_stats(h.data(), GradType::f16, 0, 20, 1.0f).nonfinite, 2);
    const GradStats clean = zb::opt::grad_block_stats(h.data(), GradType::f16, 0, 7, 0.5f);
    assert_int_equal(clean.nonfinite, 0);
    assert_true(clean.sum_squares == 7 * 0.25);
}

void test_shares_and_order(void **) {
    // Every block goes to exactly one thread, in order, for any thread count.
    for (size_t blocks : {0u, 1u, 5u, 1526u})
        for (int threads = 1; threads <= 5; ++threads) {
            size_t next = 0;
            for (int t = 0; t < threads; ++t) {
                size_t lo, hi;
                zb::opt::grad_stats_share(blocks, t, threads, lo, hi);
                assert_int_equal(lo, next);
                assert_true(hi >= lo);
                next = hi;
            }
            assert_int_equal(next, blocks);
        }
    const GradStats parts[3] = {{1e20, 1}, {1.0, 0}, {-1e20, 2}};
    const GradStats sum = zb::opt::grad_stats_sum(parts, 3);
    assert_true(sum.sum_squares == 0.0); // (1e20 + 1) - 1e20 in block order
    assert_int_equal(sum.nonfinite, 3);
}

} // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_every_level),
        cmocka_unit_test(test_nonfinite_counted_after_scale),
        cmocka_unit_test(test_shares_and_order),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
