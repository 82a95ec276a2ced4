// The pre-pass for the architecture's baseline, which every CPU of it runs: SSE2 (x86-64-v1) on
// x86-64, Advanced SIMD (NEON) on aarch64; see grad_stats_block.hpp.
#include "grad_stats_block.hpp"

namespace zb::opt::detail {

GradStats grad_block_stats_base(const void *grad, GradType type, size_t lo, size_t hi,
                                float scale) {
    return block_of_type(grad, type, lo, hi, scale);
}

} // namespace zb::opt::detail
