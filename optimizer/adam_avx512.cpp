// AVX-512F path (compiled with -mavx512f -mfma -mf16c): 16 elements per iteration. The tail runs
// the same body on a zero-padded copy, so every element takes the same instructions.
// No standard-library templates here: their out-of-line copies could be picked by the linker for
// code that runs on CPUs without AVX-512.
#include "adam_kernels.hpp"

#include <immintrin.h>
#include <string.h>

namespace zf::detail {
namespace {

constexpr size_t W = 16;
constexpr size_t kBlock = size_t{1} << 24; // iterations between sums of the non-finite counters

// The constants broadcast once per call: held in registers, they are not reloaded after every
// store (a float store may alias a `const Consts &` as far as the compiler knows).
struct Vc {
    __m512 grad_scale, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size,
        inv_bias2_sqrt, eps;
    explicit Vc(const Consts &c)
        : grad_scale(_mm512_set1_ps(c.grad_scale)), decay(_mm512_set1_ps(c.decay)),
          l2(_mm512_set1_ps(c.l2)), beta1(_mm512_set1_ps(c.beta1)),
          one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)), beta2(_mm512_set1_ps(c.beta2)),
          one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
          neg_step_size(_mm512_set1_ps(c.neg_step_size)),
          inv_bias2_sqrt(_mm512_set1_ps(c.inv_bias2_sqrt)), eps(_mm512_set1_ps(c.eps)) {}
};

template <GradType G> inline __m512 load_grad(const void *grad, size_t i) {
    if constexpr (G == GradType::f32) {
        return _mm512_loadu_ps(static_cast<const float *>(grad) + i);
    } else {
        const __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i *>(static_cast<const uint16_t *>(grad) + i));
        if constexpr (G == GradType::bf16)
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        else
            return _mm512_cvtph_ps(h);
    }
}

inline __m256i to_bf16(__m512 p) {
    const __m512i u = _mm512_castps_si512(p);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                           _mm512_and_si512(hi, _mm512_set1_epi32(1))),
                          16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i r = _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

// Updates elements [i, i + W); returns the lanes whose scaled gradient is not finite.
template <GradType G, CopyType C, bool AdamW, bool Stale>
[[gnu::always_inline]] inline __mmask16 body(const Ptrs &t, const Vc &c, size_t i) {
    __m512 g = _mm512_mul_ps(load_grad<G>(t.grad, i), c.grad_scale);
    const __mmask16 bad =
        _mm512_cmp_ps_mask(_mm512_abs_ps(g), _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    __m512 p = _mm512_loadu_ps(t.param + i);
    if constexpr (AdamW)
        p = _mm512_mul_ps(p, c.decay);
    else
        g = _mm512_fmadd_ps(c.l2, p, g);
    const __m512 m =
        _mm512_fmadd_ps(c.one_minus_beta1, g, _mm512_mul_ps(c.beta1, _mm512_loadu_ps(t.m + i)));
    const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(c.one_minus_beta2, g), g,
                                     _mm512_mul_ps(c.beta2, _mm512_loadu_ps(t.v + i)));
    const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.inv_bias2_sqrt, c.eps);
    p = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(m, d), p);
    _mm512_storeu_ps(t.param + i, p);
    _mm512_storeu_ps(t.m + i, m);
    _mm512_storeu_ps(t.v + i, v);
    if constexpr (C == CopyType::bf16)
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(static_cast<uint16_t *>(t.copy) + i),
                            to_bf16(p));
    else if constexpr (C == CopyType::f16)
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(static_cast<uint16_t *>(t.copy) + i),
                            _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if constexpr (Stale) _mm512_storeu_ps(t.stale + i, p);
    return bad;
}

// Non-finite lanes are counted in a vector of per-lane counters (one masked add per iteration),
// summed once per block of 2^24 iterations, so neither a lane nor the sum can overflow.
template <GradType G, CopyType C, bool AdamW, bool Stale>
uint64_t run(const AdamTensor &t, const Consts &consts, size_t lo, size_t hi) {
    const Ptrs ptrs{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.copy_out, t.stale};
    const Vc c(consts);
    uint64_t bad = 0;
    size_t i = lo;
    while (hi - i >= W) {
        const size_t end = i + W * ((hi - i) / W < kBlock ? (hi - i) / W : kBlock);
        __m512i count = _mm512_setzero_si512();
        for (; i < end; i += W)
            count = _mm512_mask_add_epi32(count, body<G, C, AdamW, Stale>(ptrs, c, i), count,
                                          _mm512_set1_epi32(1));
        bad += static_cast<uint32_t>(_mm512_reduce_add_epi32(count));
    }
    return bad + padded_tail<W, G, C>(t, i, hi, [&c](const Ptrs &p) {
               return static_cast<unsigned>(body<G, C, AdamW, Stale>(p, c, 0));
           });
}

} // namespace

uint64_t range_avx512(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi) {
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() {
        return dispatch_flags(c.adamw, t.stale != nullptr, [&]<bool AdamW, bool Stale>() {
            return run<G, C, AdamW, Stale>(t, c, lo, hi);
        });
    });
}

} // namespace zf::detail
