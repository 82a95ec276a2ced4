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

#include <cstring>

namespace zb::opt::detail {

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

// One tensor's streams as the vector bodies take them (a tail passes padded copies instead).
struct Ptrs {
    float *param;
    const void *grad;
    float *m;
    float *v;
    void *copy;
    float *stale;
};

// Before every loop over the vectors of an iteration: unrolled completely, its arrays of vectors
// live in registers. Left to itself, GCC 12 at the project's flags kept them on the stack and
// copied every input and output through it (AVX-512, four vectors: half the speed).
#define ZF_UNROLL _Pragma("GCC unroll 8")

// The last hi - i < W elements of a tensor: copied into zero-padded W-wide buffers, run through the
// same vector body as every other element (so they take the same arithmetic and give the same
// bits), and copied back. body(ptrs) updates elements [0, W) of ptrs and returns the mask of lanes
// with non-finite gradients (W <= 64).
template <size_t W, GradType G, CopyType C, class Body>
uint64_t padded_tail(const AdamTensor &t, size_t i, size_t hi, Body &&body) {
    const size_t r = hi - i;
    if (r == 0) return 0;
    constexpr size_t gsize = G == GradType::f32 ? 4 : 2;
    alignas(64) float p[W] = {}, m[W] = {}, v[W] = {}, s[W];
    alignas(64) unsigned char g[W * 4] = {};
    alignas(64) uint16_t cp[W];
    std::memcpy(p, t.param + i, r * 4);
    std::memcpy(m, t.exp_avg + i, r * 4);
    std::memcpy(v, t.exp_avg_sq + i, r * 4);
    std::memcpy(g, static_cast<const unsigned char *>(t.grad) + i * gsize, r * gsize);
    static_assert(W <= 64);
    const uint64_t lanes = (uint64_t{1} << r) - 1; // r < W
    const uint64_t bad = body(Ptrs{p, g, m, v, cp, s}) & lanes;
    std::memcpy(t.param + i, p, r * 4);
    std::memcpy(t.exp_avg + i, m, r * 4);
    std::memcpy(t.exp_avg_sq + i, v, r * 4);
    if constexpr (C != CopyType::none)
        std::memcpy(static_cast<uint16_t *>(t.copy_out) + i, cp, r * 2);
    if (t.stale) std::memcpy(t.stale + i, s, r * 4);
    return static_cast<uint64_t>(__builtin_popcountll(bad));
}

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

// Turns the per-tensor switches into template arguments run.operator()<AdamW, Stale>(), so the
// vector loops carry no branch on them.
template <class Run> uint64_t dispatch_flags(bool adamw, bool stale, Run &&run) {
    if (adamw)
        return stale ? run.template operator()<true, true>()
                     : run.template operator()<true, false>();
    return stale ? run.template operator()<false, true>() : run.template operator()<false, false>();
}

} // namespace zb::opt::detail
