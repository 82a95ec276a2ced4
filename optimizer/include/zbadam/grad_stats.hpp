// The read-only pass over the gradients that a step runs before it writes anything, when it must
// know whether every gradient is finite (skipping non-finite steps) or their global norm
// (clipping). Deterministic for any thread count: the gradients are cut into fixed blocks,
// whatever the thread split; each block's sum of squares is one double computed in a fixed order,
// and the blocks are summed in block order.
#pragma once

#include <zbadam/adam.hpp>

#include <cstddef>
#include <cstdint>

namespace zb::opt {

inline constexpr size_t kGradStatsBlock = size_t(1) << 16; // elements

struct GradStats {
    double sum_squares = 0; // of grad * scale, each product rounded to fp32 as the kernels do
    uint64_t nonfinite = 0; // elements whose grad * scale is not finite
};

// The statistics of grad[lo, hi), hi - lo <= kGradStatsBlock, elements of type `type`.
GradStats grad_block_stats(const void *grad, GradType type, size_t lo, size_t hi, float scale);

// Blocks of a tensor of n elements.
inline size_t grad_stats_blocks(size_t n) {
    return (n + kGradStatsBlock - 1) / kGradStatsBlock;
}

// grad_block_stats as built for level 1 (the architecture's baseline: SSE2 on x86-64, NEON on
// aarch64) or, on x86-64, ISA level 3 (AVX2, F16C, FMA) or 4 (AVX-512); null if this build or CPU
// cannot run it. grad_block_stats uses the highest it can. Every
// level gives the same bits for finite gradients (NaN payloads may differ).
using GradBlockStatsFn = GradStats (*)(const void *, GradType, size_t, size_t, float);
GradBlockStatsFn grad_block_stats_for_level(int level);

// The blocks [lo, hi) of `blocks` that `thread` of `threads` computes.
void grad_stats_share(size_t blocks, int thread, int threads, size_t &lo, size_t &hi);

// The blocks' statistics summed in block order.
GradStats grad_stats_sum(const GradStats *blocks, size_t count);

// What clipping to max_norm multiplies the gradients by, as torch.nn.utils.clip_grad_norm_:
// min(1, max_norm / (norm + 1e-6)); a NaN norm gives NaN, an infinite one 0.
float clip_coefficient(float max_norm, double sum_squares);

} // namespace zb::opt
