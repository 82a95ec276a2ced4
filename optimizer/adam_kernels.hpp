// Internal contract between the dispatcher (adam_dispatch.cpp) and the per-ISA kernels
// (adam_scalar.cpp, adam_avx2.cpp, adam_avx512.cpp). Every kernel performs exactly this sequence
// of IEEE fp32 operations on each element, which is what makes all paths give the same bits:
//
//   g  = grad * grad_scale                      (counted when not finite)
//   p  = p * decay                               (AdamW)   or   g = fma(l2, p, g)   (Adam)
//   m  = fma(one_minus_beta1, g, beta1 * m)
//   v  = fma(one_minus_beta2 * g, g, beta2 * v)
//   d  = fma(sqrt(v), inv_bias2_sqrt, eps)
//   p  = fma(neg_step_size, m / d, p)
//
// sqrt and division are the correctly rounded IEEE ones, and no kernel may contract anything else
// into an FMA (the kernels are compiled with -ffp-contract=off).
#pragma once

#include "adam.hpp"

namespace zf::detail {

// Per-tensor constants, computed once per call in double and rounded to float.
struct Consts {
    float grad_scale;
    float decay; // 1 - lr * weight_decay for AdamW, else 1
    float l2;    // weight_decay for Adam, else 0
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float neg_step_size;  // -lr / (1 - beta1^step)
    float inv_bias2_sqrt; // 1 / sqrt(1 - beta2^step)
    float eps;
    bool adamw;
};

Consts make_consts(const AdamHyper &h);

// Updates elements [lo, hi) of one tensor; returns the count of non-finite scaled gradients.
using RangeKernel = uint64_t (*)(const AdamTensor &t, const Consts &c, GradType g, CopyType cp,
                                 size_t lo, size_t hi);
uint64_t range_scalar(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi);
uint64_t range_avx2(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi);
uint64_t range_avx512(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi);

} // namespace zf::detail
