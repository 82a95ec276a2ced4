#include <zbadam/grad_stats.hpp>

#include "cpu_level.hpp"

#include <cmath>
#include <initializer_list>

namespace zb::opt {

namespace detail {
GradStats grad_block_stats_avx512(const void *grad, GradType type, size_t lo, size_t hi,
                                  float scale);
GradStats grad_block_stats_avx2(const void *grad, GradType type, size_t lo, size_t hi, float scale);
GradStats grad_block_stats_base(const void *grad, GradType type, size_t lo, size_t hi, float scale);
} // namespace detail

GradBlockStatsFn grad_block_stats_for_level(int level) {
    switch (level) {
#if defined(__x86_64__)
    case 4:
        return x86_level() >= 4 ? detail::grad_block_stats_avx512 : nullptr;
    case 3:
        return x86_level() >= 3 ? detail::grad_block_stats_avx2 : nullptr;
#endif
    case 1:
        return detail::grad_block_stats_base;
    default:
        return nullptr;
    }
}

GradStats grad_block_stats(const void *grad, GradType type, size_t lo, size_t hi, float scale) {
    static const GradBlockStatsFn best = [] {
        for (int level : {4, 3})
            if (GradBlockStatsFn fn = grad_block_stats_for_level(level)) return fn;
        return grad_block_stats_for_level(1);
    }();
    return best(grad, type, lo, hi, scale);
}

void grad_stats_share(size_t blocks, int thread, int threads, size_t &lo, size_t &hi) {
    const size_t t = static_cast<size_t>(thread),
                 n = threads > 0 ? static_cast<size_t>(threads) : 1;
    lo = blocks * t / n;
    hi = blocks * (t + 1) / n;
}

GradStats grad_stats_sum(const GradStats *blocks, size_t count) {
    GradStats s;
    for (size_t b = 0; b < count; ++b) {
        s.sum_squares += blocks[b].sum_squares;
        s.nonfinite += blocks[b].nonfinite;
    }
    return s;
}

float clip_coefficient(float max_norm, double sum_squares) {
    const double q = double(max_norm) / (std::sqrt(sum_squares) + 1e-6);
    return static_cast<float>(q >= 1.0 ? 1.0 : q); // NaN fails the test and stays NaN
}

} // namespace zb::opt
