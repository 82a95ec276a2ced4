// AVX2 path (compiled with -mavx2 -mfma -mf16c): U vectors of 8 elements per iteration, so every
// stream is read and written in whole 64-byte lines (fp32 ones two per iteration, 16-bit ones one).
// The tail runs the same body on a zero-padded copy, so every element takes the same instructions.
// No standard-library templates here: their out-of-line copies could be picked by the linker for
// code that runs on CPUs without AVX2.
#include "adam_kernels.hpp"

#include <immintrin.h>
#include <string.h>

namespace zb::opt::detail {
namespace {

constexpr size_t V = 8; // lanes of a vector
// Vectors per iteration: four, so every stream moves whole lines per iteration, a 16-bit gradient
// or copy-out one, fp32 ones two. The 16 data vectors fill the 16 registers, so GCC keeps the
// constants on the stack and folds them into the arithmetic as loads that hit L1; that was faster
// than two vectors, which keep everything in registers, on every configuration measured.
// Each step of both alternated in one process on the same buffers, N = 100M: on an Intel Xeon
// (AVX-512 CPU, AVX2 forced) KVM guest four took 0.97-0.99x the time of two on 1 and 2 threads
// for fp32, bf16 and fp16 gradients with and without copy-out and stale (0.96 for the bf16
// copy-out on 2 threads), against 0.99-1.01 for two against two; on an AMD EPYC (Zen 4), measured
// on separate buffers (whose placement alone moves a step by up to 8%), 0.98-1.03x. Eight
// (DeepSpeed's choice) spilled more and were no faster.
constexpr size_t U = 4;
constexpr size_t W = U * V; // elements per iteration

// The constants broadcast once per call: held in registers or on the stack, they are not reloaded
// from Consts after every store (a float store may alias a `const Consts &` as far as the compiler
// knows).
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

// Elements [i, i + V) and [i + V, i + 2V) of the gradient as fp32.
template <GradType G> inline void load_grad(const void *grad, size_t i, __m256 &lo, __m256 &hi) {
    if constexpr (G == GradType::f32) {
        lo = _mm256_loadu_ps(static_cast<const float *>(grad) + i);
        hi = _mm256_loadu_ps(static_cast<const float *>(grad) + i + V);
    } else {
        const __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i *>(static_cast<const uint16_t *>(grad) + i));
        const __m128i h0 = _mm256_castsi256_si128(h), h1 = _mm256_extracti128_si256(h, 1);
        if constexpr (G == GradType::bf16) {
            lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
            hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
        } else {
            lo = _mm256_cvtph_ps(h0);
            hi = _mm256_cvtph_ps(h1);
        }
    }
}

// The bf16 bits of p in the low half of each 32-bit lane.
inline __m256i bf16_bits(__m256 p) {
    const __m256i u = _mm256_castps_si256(p);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                           _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                          16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q)); // one op, not two
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

// The copy-out of elements [0, V) from lo and [V, 2V) from hi.
template <CopyType C> inline __m256i to_copy(__m256 lo, __m256 hi) {
    if constexpr (C == CopyType::bf16) {
        // Every lane is below 0x10000, so the saturating pack is a plain narrowing; it interleaves
        // the 128-bit halves, which the permutation puts back in order.
        return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(lo), bf16_bits(hi)), 0xd8);
    } else {
        constexpr int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        return _mm256_set_m128i(_mm256_cvtps_ph(hi, round), _mm256_cvtps_ph(lo, round));
    }
}

// The arithmetic of adam_kernels.hpp on one vector; returns all ones in the lanes whose scaled
// gradient is not finite.
template <bool AdamW>
[[gnu::always_inline]] inline __m256i update(const Vc &c, __m256 g, __m256 &p, __m256 &m,
                                             __m256 &v) {
    g = _mm256_mul_ps(g, c.grad_scale);
    const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 bad = _mm256_cmp_ps(abs, _mm256_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    if constexpr (AdamW)
        p = _mm256_mul_ps(p, c.decay);
    else
        g = _mm256_fmadd_ps(c.l2, p, g);
    m = _mm256_fmadd_ps(c.one_minus_beta1, g, _mm256_mul_ps(c.beta1, m));
    v = _mm256_fmadd_ps(_mm256_mul_ps(c.one_minus_beta2, g), g, _mm256_mul_ps(c.beta2, v));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(v), c.inv_bias2_sqrt, c.eps);
    p = _mm256_fmadd_ps(c.neg_step_size, _mm256_div_ps(m, d), p);
    return _mm256_castps_si256(bad);
}

// Updates elements [i, i + W) and sets bad[u] to all ones in the lanes of vector u whose scaled
// gradient is not finite. Every stream is read before any is written: a load that follows a store
// to another stream at the same offset in its page waits on it (4K aliasing), and large buffers
// are often aligned alike.
template <GradType G, CopyType C, bool AdamW, bool Stale, bool Stream>
[[gnu::always_inline]] inline void body(const Ptrs &t, const Vc &c, size_t i, __m256i (&bad)[U]) {
    __m256 g[U], p[U], m[U], v[U];
    ZB_UNROLL
    for (size_t u = 0; u < U; u += 2)
        load_grad<G>(t.grad, i + u * V, g[u], g[u + 1]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        p[u] = _mm256_loadu_ps(t.param + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        m[u] = _mm256_loadu_ps(t.m + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        v[u] = _mm256_loadu_ps(t.v + i + u * V);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        bad[u] = update<AdamW>(c, g[u], p[u], m[u], v[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        _mm256_storeu_ps(t.param + i + u * V, p[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        _mm256_storeu_ps(t.m + i + u * V, m[u]);
    ZB_UNROLL
    for (size_t u = 0; u < U; ++u)
        _mm256_storeu_ps(t.v + i + u * V, v[u]);
    if constexpr (C != CopyType::none) ZB_UNROLL
    for (size_t u = 0; u < U; u += 2) {
        auto *to = reinterpret_cast<__m256i *>(static_cast<uint16_t *>(t.copy) + i + u * V);
        if constexpr (Stream)
            _mm256_stream_si256(to, to_copy<C>(p[u], p[u + 1]));
        else
            _mm256_storeu_si256(to, to_copy<C>(p[u], p[u + 1]));
    }
    if constexpr (Stale) ZB_UNROLL
    for (size_t u = 0; u < U; ++u) {
        if constexpr (Stream)
            _mm256_stream_ps(t.stale + i + u * V, p[u]);
        else
            _mm256_storeu_ps(t.stale + i + u * V, p[u]);
    }
}

// What run_range (adam_kernels.hpp) needs of this path. Non-finite lanes are counted by
// subtracting their all-ones masks.
struct Kernel {
    static constexpr size_t W = detail::W;
    using Vc = detail::Vc;
    struct Bad {
        __m256i lanes[U];
    };
    using Count = __m256i;
    template <GradType G, CopyType C, bool AdamW, bool Stale, bool Stream>
    [[gnu::always_inline]] static void body(const Ptrs &t, const Vc &c, size_t i, Bad &bad) {
        detail::body<G, C, AdamW, Stale, Stream>(t, c, i, bad.lanes);
    }
    static Count zero() { return _mm256_setzero_si256(); }
    [[gnu::always_inline]] static void add(Count &count, const Bad &b) {
        ZB_UNROLL
        for (size_t u = 0; u < U; ++u)
            count = _mm256_sub_epi32(count, b.lanes[u]);
    }
    static uint64_t sum(Count count) {
        const __m128i half =
            _mm_add_epi32(_mm256_castsi256_si128(count), _mm256_extracti128_si256(count, 1));
        const __m128i quarter = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        return static_cast<uint32_t>(
            _mm_cvtsi128_si32(_mm_add_epi32(quarter, _mm_srli_epi64(quarter, 32))));
    }
    static uint64_t count(const Bad &b, size_t r) {
        uint64_t out = 0;
        for (size_t u = 0; u < U && u * V < r; ++u) {
            const size_t n = r - u * V < V ? r - u * V : V;
            const unsigned mask =
                static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(b.lanes[u])));
            out += static_cast<uint64_t>(__builtin_popcount(mask & ((1u << n) - 1)));
        }
        return out;
    }
    static void fence() { _mm_sfence(); }
};

} // namespace

uint64_t range_avx2(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi) {
    return range<Kernel>(t, c, g, cp, lo, hi);
}

} // namespace zb::opt::detail
