// NEON (Advanced SIMD) path, every ARMv8 CPU: U vectors of 4 elements per iteration, so every fp32
// stream moves one whole 64-byte line per iteration. The 16 data vectors and the 10 constants
// fit the 32 registers. The tail runs the same body on a zero-padded copy (run_range in
// adam_kernels.hpp), so every element takes the same instructions.
//
// The arithmetic is adam_kernels.hpp's: FMLA is a fused multiply-add, FSQRT and FDIV are the
// correctly rounded IEEE operations, and Linux starts every process in round-to-nearest-even
// without flush-to-zero, as x86-64 does; so these are the scalar path's bits and the x86 paths'.
// NaNs are the exception: when an operand is a NaN both propagate one, but an operation that makes
// one (0/0, inf - inf) gives the default NaN, positive on Arm and negative on x86-64.
//
// Non-temporal stores: NEON has only STNP, a hint that no measurement here could weigh, so this
// path writes every stream with plain stores whatever the batch asks (its results are the same).
#include "adam_kernels.hpp"

#include <arm_neon.h>

namespace zb::opt::detail {
namespace {

constexpr size_t V = 4; // lanes of a vector
constexpr size_t U = 4; // vectors per iteration
constexpr size_t W = U * V;

struct Vc {
    float32x4_t grad_scale, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2,
        neg_step_size, inv_bias2_sqrt, eps;
    explicit Vc(const Consts &c)
        : grad_scale(vdupq_n_f32(c.grad_scale)), decay(vdupq_n_f32(c.decay)), l2(vdupq_n_f32(c.l2)),
          beta1(vdupq_n_f32(c.beta1)), one_minus_beta1(vdupq_n_f32(c.one_minus_beta1)),
          beta2(vdupq_n_f32(c.beta2)), one_minus_beta2(vdupq_n_f32(c.one_minus_beta2)),
          neg_step_size(vdupq_n_f32(c.neg_step_size)),
          inv_bias2_sqrt(vdupq_n_f32(c.inv_bias2_sqrt)), eps(vdupq_n_f32(c.eps)) {}
};

// Elements [i, i + V) and [i + V, i + 2V) of the gradient as fp32 (fp16 to fp32 is exact).
template <GradType G>
inline void load_grad(const void *grad, size_t i, float32x4_t &lo, float32x4_t &hi) {
    if constexpr (G == GradType::f32) {
        lo = vld1q_f32(static_cast<const float *>(grad) + i);
        hi = vld1q_f32(static_cast<const float *>(grad) + i + V);
    } else {
        const uint16x8_t h = vld1q_u16(static_cast<const uint16_t *>(grad) + i);
        if constexpr (G == GradType::bf16) {
            lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
            hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        } else {
            const float16x8_t f = vreinterpretq_f16_u16(h);
            lo = vcvt_f32_f16(vget_low_f16(f));
            hi = vcvt_high_f32_f16(f);
        }
    }
}

// The bf16 bits of p (adam_convert.hpp's rounding) in the low half of each 32-bit lane.
inline uint32x4_t bf16_bits(float32x4_t p) {
    const uint32x4_t u = vreinterpretq_u32_f32(p);
    const uint32x4_t hi = vshrq_n_u32(u, 16);
    const uint32x4_t rounded = vshrq_n_u32(
        vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), vandq_u32(hi, vdupq_n_u32(1))), 16);
    const uint32x4_t ordered = vceqq_f32(p, p); // all ones but in NaN lanes
    return vbslq_u32(ordered, rounded, vorrq_u32(hi, vdupq_n_u32(0x40)));
}

// The copy-out of elements [0, V) from lo and [V, 2V) from hi. FCVTN rounds to nearest even
// (the FPCR's mode) and keeps a NaN quiet with its payload's top bits, as VCVTPS2PH does.
template <CopyType C> inline uint16x8_t to_copy(float32x4_t lo, float32x4_t hi) {
    if constexpr (C == CopyType::bf16)
        return vcombine_u16(vmovn_u32(bf16_bits(lo)), vmovn_u32(bf16_bits(hi)));
    else
        return vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(lo), hi));
}

// The arithmetic of adam_kernels.hpp on one vector; returns all ones in the lanes whose scaled
// gradient is not finite. vfmaq_f32(a, b, c) is a + b * c, rounded once.
template <bool AdamW>
[[gnu::always_inline]] inline uint32x4_t update(const Vc &c, float32x4_t g, float32x4_t &p,
                                                float32x4_t &m, float32x4_t &v) {
    g = vmulq_f32(g, c.grad_scale);
    const uint32x4_t finite = vcltq_f32(vabsq_f32(g), vdupq_n_f32(__builtin_inff()));
    if constexpr (AdamW)
        p = vmulq_f32(p, c.decay);
    else
        g = vfmaq_f32(g, c.l2, p);
    m = vfmaq_f32(vmulq_f32(c.beta1, m), c.one_minus_beta1, g);
    v = vfmaq_f32(vmulq_f32(c.beta2, v), vmulq_f32(c.one_minus_beta2, g), g);
    const float32x4_t d = vfmaq_f32(c.eps, vsqrtq_f32(v), c.inv_bias2_sqrt);
    p = vfmaq_f32(p, c.neg_step_size, vdivq_f32(m, d));
    return vmvnq_u32(finite);
}

// Updates elements [i, i + W); every stream is read before any is written, as on x86-64.
template <GradType G, CopyType C, bool AdamW, bool Stale>
[[gnu::always_inline]] inline void body(const Ptrs &t, const Vc &c, size_t i,
                                        uint32x4_t (&bad)[U]) {
    float32x4_t g[U], p[U], m[U], v[U];
    ZB_UNROLL
    for (size_t u = 0; u < U; u += 2)
        load_grad<G>(t.grad, i + u * V, g[u], g[u + 1]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        p[u] = vld1q_f32(t.param + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        m[u] = vld1q_f32(t.m + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        v[u] = vld1q_f32(t.v + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        bad[u] = update<AdamW>(c, g[u], p[u], m[u], v[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        vst1q_f32(t.param + i + u * V, p[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        vst1q_f32(t.m + i + u * V, m[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        vst1q_f32(t.v + i + u * V, v[u]);
    if constexpr (C != CopyType::none) ZB_UNROLL
    for (size_t u = 0; u < U; u += 2)
        vst1q_u16(static_cast<uint16_t *>(t.copy) + i + u * V, to_copy<C>(p[u], p[u + 1]));
    if constexpr (Stale) ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        vst1q_f32(t.stale + i + u * V, p[u]);
}

// What run_range (adam_kernels.hpp) needs of this path. Non-finite lanes are counted by
// subtracting their all-ones masks.
struct Kernel {
    static constexpr size_t W = detail::W;
    using Vc = detail::Vc;
    struct Bad {
        uint32x4_t lanes[U];
    };
    using Count = uint32x4_t;
    template <GradType G, CopyType C, bool AdamW, bool Stale, bool /*Stream*/>
    [[gnu::always_inline]] static void body(const Ptrs &t, const Vc &c, size_t i, Bad &bad) {
        detail::body<G, C, AdamW, Stale>(t, c, i, bad.lanes);
    }
    static Count zero() { return vdupq_n_u32(0); }
    [[gnu::always_inline]] static void add(Count &count, const Bad &b) {
        ZB_UNROLL
        for (size_t u = 0; u < U; ++u)
            count = vsubq_u32(count, b.lanes[u]);
    }
    static uint64_t sum(Count count) { return vaddvq_u32(count); }
    static uint64_t count(const Bad &b, size_t r) {
        uint64_t out = 0;
        for (size_t u = 0; u < U; ++u) {
            uint32_t lanes[V];
            vst1q_u32(lanes, b.lanes[u]);
            for (size_t l = 0; l < V; ++l)
                out += u * V + l < r && lanes[l] != 0;
        }
        return out;
    }
    static void fence() {}
};

} // namespace

uint64_t range_neon(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi) {
    return range<Kernel>(t, c, g, cp, lo, hi);
}

} // namespace zb::opt::detail
