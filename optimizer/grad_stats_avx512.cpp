// The pre-pass for AVX-512 (x86-64-v4); see grad_stats_block.hpp.
#include "grad_stats_block.hpp"

namespace zb::opt::detail {

GradStats grad_block_stats_avx512(const void *grad, GradType type, size_t lo, size_t hi,
                                  float scale) {
    return block_of_type(grad, type, lo, hi, scale);
}

} // namespace zb::opt::detail
