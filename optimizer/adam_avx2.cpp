// AVX2 path (compiled with -mavx2 -mfma -mf16c): 8 elements per iteration. The tail runs
// the same body on a zero-padded copy, so every element takes the same instructions.
// No standard-library templates here: their out-of-line copies could be picked by the linker for
// code that runs on CPUs without AVX2.
#include "adam_kernels.hpp"

#include <immintrin.h>
#include <string.h>

namespace zf::detail {
namespace {

constexpr size_t W = 8;
constexpr size_t kBlock = size_t{1} << 24; // iterations between sums of the non-finite counters

// The constants broadcast once per call: held in registers, they are not reloaded after every
// store (a float store may alias a `const Consts &` as far as the compiler knows).
struct Vc {
    __m256 grad_scale, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size,
        inv_bias2_sqrt, eps;
    explicit Vc(const Consts &c)
        : grad_scale(_mm256_set1_ps(c.grad_scale)), decay(_mm256_set1_ps(c.decay)),
          l2(_mm256_set1_ps(c.l2)), beta1(_mm256_set1_ps(c.beta1)),
          one_minus_beta1(_mm256_set1_ps(c.one_minus_beta1)), beta2(_mm256_set1_ps(c.beta2)),
          one_minus_beta2(_mm256_set1_ps(c.one_minus_beta2)),
          neg_step_size(_mm256_set1_ps(c.neg_step_size)),
          inv_bias2_sqrt(_mm256_set1_ps(c.inv_bias2_sqrt)), eps(_mm256_set1_ps(c.eps)) {}
};

template <GradType G> inline __m256 load_grad(const void *grad, size_t i) {
    if constexpr (G == GradType::f32) {
        return _mm256_loadu_ps(static_cast<const float *>(grad) + i);
    } else {
        const __m128i h = _mm_loadu_si128(
            reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(grad) + i));
        if constexpr (G == GradType::bf16)
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        else
            return _mm256_cvtph_ps(h);
    }
}

inline __m128i to_bf16(__m256 p) {
    const __m256i u = _mm256_castps_si256(p);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                           _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                          16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r =
        _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Every lane is below 0x10000, so the saturating pack is a plain narrowing.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}

// Updates elements [i, i + W); returns all ones in the lanes whose scaled gradient is not finite.
template <GradType G, CopyType C, bool AdamW, bool Stale>
[[gnu::always_inline]] inline __m256i body(const Ptrs &t, const Vc &c, size_t i) {
    __m256 g = _mm256_mul_ps(load_grad<G>(t.grad, i), c.grad_scale);
    const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 bad = _mm256_cmp_ps(abs, _mm256_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    __m256 p = _mm256_loadu_ps(t.param + i);
    if constexpr (AdamW)
        p = _mm256_mul_ps(p, c.decay);
    else
        g = _mm256_fmadd_ps(c.l2, p, g);
    const __m256 m =
        _mm256_fmadd_ps(c.one_minus_beta1, g, _mm256_mul_ps(c.beta1, _mm256_loadu_ps(t.m + i)));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(c.one_minus_beta2, g), g,
                                     _mm256_mul_ps(c.beta2, _mm256_loadu_ps(t.v + i)));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(v), c.inv_bias2_sqrt, c.eps);
    p = _mm256_fmadd_ps(c.neg_step_size, _mm256_div_ps(m, d), p);
    _mm256_storeu_ps(t.param + i, p);
    _mm256_storeu_ps(t.m + i, m);
    _mm256_storeu_ps(t.v + i, v);
    if constexpr (C == CopyType::bf16)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(t.copy) + i),
                         to_bf16(p));
    else if constexpr (C == CopyType::f16)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(t.copy) + i),
                         _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if constexpr (Stale) _mm256_storeu_ps(t.stale + i, p);
    return _mm256_castps_si256(bad);
}

// Non-finite lanes are counted in a vector of per-lane counters (subtracting the all-ones lanes),
// summed once per block of 2^24 iterations, so neither a lane nor the sum can overflow.
template <GradType G, CopyType C, bool AdamW, bool Stale>
uint64_t run(const AdamTensor &t, const Consts &consts, size_t lo, size_t hi) {
    const Ptrs ptrs{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.copy_out, t.stale};
    const Vc c(consts);
    uint64_t bad = 0;
    size_t i = lo;
    while (hi - i >= W) {
        const size_t end = i + W * ((hi - i) / W < kBlock ? (hi - i) / W : kBlock);
        __m256i count = _mm256_setzero_si256();
        for (; i < end; i += W)
            count = _mm256_sub_epi32(count, body<G, C, AdamW, Stale>(ptrs, c, i));
        const __m128i half =
            _mm_add_epi32(_mm256_castsi256_si128(count), _mm256_extracti128_si256(count, 1));
        const __m128i quarter = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        bad += static_cast<uint32_t>(
            _mm_cvtsi128_si32(_mm_add_epi32(quarter, _mm_srli_epi64(quarter, 32))));
    }
    return bad + padded_tail<W, G, C>(t, i, hi, [&c](const Ptrs &p) {
               return static_cast<unsigned>(
                   _mm256_movemask_ps(_mm256_castsi256_ps(body<G, C, AdamW, Stale>(p, c, 0))));
           });
}

} // namespace

uint64_t range_avx2(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi) {
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() {
        return dispatch_flags(c.adamw, t.stale != nullptr, [&]<bool AdamW, bool Stale>() {
            return run<G, C, AdamW, Stale>(t, c, lo, hi);
        });
    });
}

} // namespace zf::detail
