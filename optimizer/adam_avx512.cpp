// AVX-512F path (compiled with -mavx512f -mfma -mf16c): U vectors of 16 elements per iteration,
// every stream read and written in whole 64-byte lines (a 16-bit gradient or copy-out a line per
// pair of vectors), the write-only ones non-temporal when streams_out() says so. The tail runs the
// same body on a zero-padded copy, so every element takes the same instructions. No
// standard-library templates here: their out-of-line copies could be picked by the linker for code
// that runs on CPUs without AVX-512.
#include "adam_kernels.hpp"

#include <immintrin.h>
#include <string.h>

namespace zb::opt::detail {
namespace {

constexpr size_t V = 16; // lanes of a vector
// Vectors per iteration: four, so each stream moves four whole lines (a 16-bit gradient or copy-out
// two) per iteration, and the 16 data vectors and the constants stay in the 32 registers (eight
// would spill). Measured on an AMD EPYC (Zen 4) 2-vCPU VM, N = 100M fp32, each step alternated in
// one process with DeepSpeed's Step_8 (median of 3-5 runs of 20-30 pairs): two vectors gave
// 0.96-1.07x DeepSpeed on 1 thread and 1.08x on 2, four 1.01-1.06x and 1.13x, eight no better and
// slower with bf16 gradients and copy-out.
constexpr size_t U = 4;
constexpr size_t W = U * V; // elements per iteration

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

// Elements [i, i + V) and [i + V, i + 2V) of the gradient as fp32.
template <GradType G> inline void load_grad(const void *grad, size_t i, __m512 &lo, __m512 &hi) {
    if constexpr (G == GradType::f32) {
        lo = _mm512_loadu_ps(static_cast<const float *>(grad) + i);
        hi = _mm512_loadu_ps(static_cast<const float *>(grad) + i + V);
    } else {
        const __m512i h = _mm512_loadu_si512(static_cast<const uint16_t *>(grad) + i);
        const __m256i h0 = _mm512_castsi512_si256(h), h1 = _mm512_extracti64x4_epi64(h, 1);
        if constexpr (G == GradType::bf16) {
            lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
            hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
        } else {
            lo = _mm512_cvtph_ps(h0);
            hi = _mm512_cvtph_ps(h1);
        }
    }
}

inline __m256i to_bf16(__m512 p) {
    const __m512i u = _mm512_castps_si512(p);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                           _mm512_and_si512(hi, _mm512_set1_epi32(1))),
                          16);
    const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q); // one compare, not and + compare
    const __m512i r = _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

template <CopyType C> inline __m256i to_copy(__m512 p) {
    if constexpr (C == CopyType::bf16)
        return to_bf16(p);
    else
        return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// The arithmetic of adam_kernels.hpp on one vector; returns the lanes whose scaled gradient is not
// finite.
template <bool AdamW>
[[gnu::always_inline]] inline __mmask16 update(const Vc &c, __m512 g, __m512 &p, __m512 &m,
                                               __m512 &v) {
    g = _mm512_mul_ps(g, c.grad_scale);
    const __mmask16 bad =
        _mm512_cmp_ps_mask(_mm512_abs_ps(g), _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    if constexpr (AdamW)
        p = _mm512_mul_ps(p, c.decay);
    else
        g = _mm512_fmadd_ps(c.l2, p, g);
    m = _mm512_fmadd_ps(c.one_minus_beta1, g, _mm512_mul_ps(c.beta1, m));
    v = _mm512_fmadd_ps(_mm512_mul_ps(c.one_minus_beta2, g), g, _mm512_mul_ps(c.beta2, v));
    const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.inv_bias2_sqrt, c.eps);
    p = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(m, d), p);
    return bad;
}

// Updates elements [i, i + W) and sets bad[u] to the lanes of vector u whose scaled gradient is
// not finite. Each pair of vectors is read, updated and written before the next pair is read, as a
// plain loop over the elements would: holding every load of the iteration back until all four
// streams were read (the earlier order here) took 1.11-1.14x the time of this one on an AMD EPYC
// (Zen 4) guest, 1 thread, N = 100M, each alternated in one process. The stores of a vector go to
// its own offsets, which the loads of the next one do not share, so no load waits on a store to
// the same offset in another stream's page (4K aliasing).
template <GradType G, CopyType C, bool AdamW, bool Stale, bool Stream>
[[gnu::always_inline]] inline void body(const Ptrs &t, const Vc &c, size_t i, __mmask16 (&bad)[U]) {
    ZB_UNROLL
    for (size_t u = 0; u < U; u += 2) {
        __m512 g[2], p[2];
        load_grad<G>(t.grad, i + u * V, g[0], g[1]);
        ZB_UNROLL
        for (size_t k = 0; k < 2; ++k) {
            const size_t at = i + (u + k) * V;
            __m512 m = _mm512_loadu_ps(t.m + at), v = _mm512_loadu_ps(t.v + at);
            p[k] = _mm512_loadu_ps(t.param + at);
            bad[u + k] = update<AdamW>(c, g[k], p[k], m, v);
            _mm512_storeu_ps(t.m + at, m);
            _mm512_storeu_ps(t.v + at, v);
            _mm512_storeu_ps(t.param + at, p[k]);
            if constexpr (Stale) {
                if constexpr (Stream)
                    _mm512_stream_ps(t.stale + at, p[k]);
                else
                    _mm512_storeu_ps(t.stale + at, p[k]);
            }
        }
        if constexpr (C != CopyType::none) {
            void *to = static_cast<uint16_t *>(t.copy) + i + u * V;
            const __m512i h =
                _mm512_inserti64x4(_mm512_castsi256_si512(to_copy<C>(p[0])), to_copy<C>(p[1]), 1);
            if constexpr (Stream)
                _mm512_stream_si512(static_cast<__m512i *>(to), h);
            else
                _mm512_storeu_si512(to, h);
        }
    }
}

// What run_range (adam_kernels.hpp) needs of this path. Non-finite lanes are counted with one
// masked add per vector.
struct Kernel {
    static constexpr size_t W = detail::W;
    using Vc = detail::Vc;
    struct Bad {
        __mmask16 lanes[U];
    };
    using Count = __m512i;
    template <GradType G, CopyType C, bool AdamW, bool Stale, bool Stream>
    [[gnu::always_inline]] static void body(const Ptrs &t, const Vc &c, size_t i, Bad &bad) {
        detail::body<G, C, AdamW, Stale, Stream>(t, c, i, bad.lanes);
    }
    static Count zero() { return _mm512_setzero_si512(); }
    [[gnu::always_inline]] static void add(Count &count, const Bad &b) {
        ZB_UNROLL
        for (size_t u = 0; u < U; ++u)
            count = _mm512_mask_add_epi32(count, b.lanes[u], count, _mm512_set1_epi32(1));
    }
    static uint64_t sum(Count count) {
        return static_cast<uint32_t>(_mm512_reduce_add_epi32(count));
    }
    static uint64_t count(const Bad &b, size_t r) {
        uint64_t out = 0;
        for (size_t u = 0; u < U && u * V < r; ++u) {
            const size_t n = r - u * V < V ? r - u * V : V;
            out += static_cast<uint64_t>(
                __builtin_popcount(b.lanes[u] & static_cast<unsigned>((uint32_t{1} << n) - 1)));
        }
        return out;
    }
    static void fence() { _mm_sfence(); }
};

} // namespace

uint64_t range_avx512(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi) {
    return range<Kernel>(t, c, g, cp, lo, hi);
}

} // namespace zb::opt::detail
