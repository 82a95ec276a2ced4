// SVE path (compiled with +sve), for any vector length the CPU has (128 to 2048 bits): one vector
// of svcntw() elements per step of a predicated loop, so the last, partial vector takes the same
// instructions as every other and needs no padded copy. 16-bit gradients are loaded into the low
// half of 32-bit lanes (LD1H zero-extending) and copy-outs stored from there (ST1H truncating).
//
// The arithmetic is adam_kernels.hpp's: svmla is a fused multiply-add, svsqrt and svdiv the
// correctly rounded IEEE operations, in the FPCR's round-to-nearest-even without flush-to-zero;
// so these are the scalar path's bits and every other path's (NaNs made by an operation aside:
// adam_neon.cpp). Plain stores throughout, like the NEON path (a streaming batch gets the same
// results); prefetches as the other paths ask, every 64 elements.
#include "adam_kernels.hpp"

#include <arm_sve.h>

namespace zb::opt::detail {
namespace {

constexpr size_t kPrefetchBlock = 64; // elements: one line of the 16-bit streams, four of fp32

template <GradType G> inline svfloat32_t load_grad(svbool_t pg, const void *grad, size_t i) {
    if constexpr (G == GradType::f32) {
        return svld1_f32(pg, static_cast<const float *>(grad) + i);
    } else {
        const svuint32_t h = svld1uh_u32(pg, static_cast<const uint16_t *>(grad) + i);
        if constexpr (G == GradType::bf16)
            return svreinterpret_f32_u32(svlsl_n_u32_x(pg, h, 16));
        else
            return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(h));
    }
}

// The copy-out bits of p in the low half of each 32-bit lane (adam_convert.hpp's bf16 rounding;
// FCVT to half as FCVTN in adam_neon.cpp).
template <CopyType C> inline svuint32_t to_copy(svbool_t pg, svfloat32_t p) {
    if constexpr (C == CopyType::bf16) {
        const svuint32_t u = svreinterpret_u32_f32(p);
        const svuint32_t hi = svlsr_n_u32_x(pg, u, 16);
        const svuint32_t rounded = svlsr_n_u32_x(
            pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7fff), svand_n_u32_x(pg, hi, 1)), 16);
        return svsel_u32(svcmpuo_f32(pg, p, p), svorr_n_u32_x(pg, hi, 0x40), rounded);
    } else {
        return svreinterpret_u32_f16(svcvt_f16_f32_x(pg, p));
    }
}

template <GradType G, CopyType C, bool AdamW, bool Stale, Prefetch P>
uint64_t run(const AdamTensor &t, const Consts &c, size_t lo, size_t hi) {
    const svfloat32_t grad_scale = svdup_n_f32(c.grad_scale), decay = svdup_n_f32(c.decay),
                      l2 = svdup_n_f32(c.l2), beta1 = svdup_n_f32(c.beta1),
                      one_minus_beta1 = svdup_n_f32(c.one_minus_beta1),
                      beta2 = svdup_n_f32(c.beta2),
                      one_minus_beta2 = svdup_n_f32(c.one_minus_beta2),
                      neg_step_size = svdup_n_f32(c.neg_step_size),
                      inv_bias2_sqrt = svdup_n_f32(c.inv_bias2_sqrt), eps = svdup_n_f32(c.eps),
                      inf = svdup_n_f32(__builtin_inff());
    const Ptrs ptrs{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.copy_out, t.stale};
    const size_t lanes = svcntw();
    uint64_t bad = 0;
    for (size_t block = lo; block < hi; block += kPrefetchBlock) {
        if constexpr (P != Prefetch::off) prefetch_ahead<kPrefetchBlock, G, P>(ptrs, block);
        const size_t end = hi - block < kPrefetchBlock ? hi : block + kPrefetchBlock;
        for (size_t i = block; i < end; i += lanes) {
            const svbool_t pg = svwhilelt_b32_u64(i, end);
            svfloat32_t g = svmul_f32_x(pg, load_grad<G>(pg, t.grad, i), grad_scale);
            svfloat32_t p = svld1_f32(pg, t.param + i);
            svfloat32_t m = svld1_f32(pg, t.exp_avg + i);
            svfloat32_t v = svld1_f32(pg, t.exp_avg_sq + i);
            const svbool_t finite = svcmplt_f32(pg, svabs_f32_x(pg, g), inf);
            bad += svcntp_b32(pg, svnot_b_z(pg, finite));
            if constexpr (AdamW)
                p = svmul_f32_x(pg, p, decay);
            else
                g = svmla_f32_x(pg, g, l2, p);
            m = svmla_f32_x(pg, svmul_f32_x(pg, beta1, m), one_minus_beta1, g);
            v = svmla_f32_x(pg, svmul_f32_x(pg, beta2, v), svmul_f32_x(pg, one_minus_beta2, g), g);
            const svfloat32_t d = svmla_f32_x(pg, eps, svsqrt_f32_x(pg, v), inv_bias2_sqrt);
            p = svmla_f32_x(pg, p, neg_step_size, svdiv_f32_x(pg, m, d));
            svst1_f32(pg, t.param + i, p);
            svst1_f32(pg, t.exp_avg + i, m);
            svst1_f32(pg, t.exp_avg_sq + i, v);
            if constexpr (C != CopyType::none)
                svst1h_u32(pg, static_cast<uint16_t *>(t.copy_out) + i, to_copy<C>(pg, p));
            if constexpr (Stale) svst1_f32(pg, t.stale + i, p);
        }
    }
    return bad;
}

} // namespace

size_t sve_bytes() {
    return svcntb();
}

uint64_t range_sve(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                   size_t hi) {
    // No non-temporal stores on this path: every batch takes the plain-store instantiations.
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() {
        return dispatch_flags(c.adamw, t.stale != nullptr, false,
                              [&]<bool AdamW, bool Stale, bool>() -> uint64_t {
                                  switch (c.prefetch) {
                                  case Prefetch::l1:
                                      return run<G, C, AdamW, Stale, Prefetch::l1>(t, c, lo, hi);
                                  case Prefetch::l2:
                                      return run<G, C, AdamW, Stale, Prefetch::l2>(t, c, lo, hi);
                                  default:
                                      return run<G, C, AdamW, Stale, Prefetch::off>(t, c, lo, hi);
                                  }
                              });
    });
}

} // namespace zb::opt::detail
