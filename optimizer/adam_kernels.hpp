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

// Turns the run-time element types into the kernel instantiation run.operator()<G, C>(): the
// one place every ISA's entry point maps (grad, copy) to template arguments.
template <class Run> uint64_t dispatch_types(GradType g, CopyType cp, Run &&run) {
    const auto with_copy = [&]<GradType G>() -> uint64_t {
        switch (cp) {
        case CopyType::bf16:
            return run.template operator()<G, CopyType::bf16>();
        case CopyType::f16:
            return run.template operator()<G, CopyType::f16>();
        default:
            return run.template operator()<G, CopyType::none>();
        }
    };
    switch (g) {
    case GradType::bf16:
        return with_copy.template operator()<GradType::bf16>();
    case GradType::f16:
        return with_copy.template operator()<GradType::f16>();
    default:
        return with_copy.template operator()<GradType::f32>();
    }
}

} // namespace zf::detail
