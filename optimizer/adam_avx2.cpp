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

// Returns the lanes whose scaled gradient is not finite.
template <GradType G, CopyType C> inline unsigned body(const Ptrs &t, const Consts &c, size_t i) {
    __m256 g = _mm256_mul_ps(load_grad<G>(t.grad, i), _mm256_set1_ps(c.grad_scale));
    const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 finite = _mm256_cmp_ps(abs, _mm256_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    __m256 p = _mm256_loadu_ps(t.param + i);
    if (c.adamw)
        p = _mm256_mul_ps(p, _mm256_set1_ps(c.decay));
    else
        g = _mm256_fmadd_ps(_mm256_set1_ps(c.l2), p, g);
    const __m256 m =
        _mm256_fmadd_ps(_mm256_set1_ps(c.one_minus_beta1), g,
                        _mm256_mul_ps(_mm256_set1_ps(c.beta1), _mm256_loadu_ps(t.m + i)));
    const __m256 v =
        _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta2), g), g,
                        _mm256_mul_ps(_mm256_set1_ps(c.beta2), _mm256_loadu_ps(t.v + i)));
    const __m256 d =
        _mm256_fmadd_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(c.inv_bias2_sqrt), _mm256_set1_ps(c.eps));
    p = _mm256_fmadd_ps(_mm256_set1_ps(c.neg_step_size), _mm256_div_ps(m, d), p);
    _mm256_storeu_ps(t.param + i, p);
    _mm256_storeu_ps(t.m + i, m);
    _mm256_storeu_ps(t.v + i, v);
    if constexpr (C == CopyType::bf16)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(t.copy) + i),
                         to_bf16(p));
    else if constexpr (C == CopyType::f16)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(t.copy) + i),
                         _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (t.stale) _mm256_storeu_ps(t.stale + i, p);
    return static_cast<unsigned>(~_mm256_movemask_ps(finite)) & 0xffu;
}

template <GradType G, CopyType C>
uint64_t run(const AdamTensor &t, const Consts &c, size_t lo, size_t hi) {
    const Ptrs ptrs{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.copy_out, t.stale};
    uint64_t bad = 0;
    size_t i = lo;
    for (; i + 4 * W <= hi; i += 4 * W) {
        prefetch32<G>(ptrs, i);
        unsigned b = 0;
        for (size_t k = 0; k < 4; ++k)
            b |= body<G, C>(ptrs, c, i + k * W) << (k * W);
        bad += static_cast<uint64_t>(__builtin_popcount(b));
    }
    for (; i + W <= hi; i += W)
        bad += static_cast<uint64_t>(__builtin_popcount(body<G, C>(ptrs, c, i)));
    return bad + padded_tail<W, G, C>(t, c, i, hi, [](const Ptrs &ptr, const Consts &k, size_t at) {
               return body<G, C>(ptr, k, at);
           });
}

} // namespace

uint64_t range_avx2(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi) {
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() { return run<G, C>(t, c, lo, hi); });
}

} // namespace zf::detail
