#include "roofline.hpp"

#include <zbadam/prefetch.hpp>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zb::opt::bench {
namespace {

// One element of the pass on its bits. `zero` is 0 at run time but unknown to the compiler, so it
// can neither drop a load nor prove a store redundant, and no bit changes: param and moments are
// read and written back, the gradient is read (into v's unchanged bits), the copy-out receives
// the param's high half (its value does not matter) and stale the param. Reads come before writes
// in the source, as in the kernels; the compiler may still make each stream a read-modify-write,
// whose load then follows the previous stream's store at the same offset in its page when the
// buffers are aligned alike (4K aliasing): that is what a plain loop gets on such buffers.
template <typename G, bool Copy, bool Stale>
[[gnu::always_inline]] inline void element(uint32_t *__restrict p, const G *__restrict g,
                                           uint32_t *__restrict m, uint32_t *__restrict v,
                                           uint16_t *__restrict c, uint32_t *__restrict s, size_t i,
                                           uint32_t zero) {
    const uint32_t pi = p[i] ^ zero, mi = m[i] ^ zero;
    const uint32_t vi = v[i] ^ (static_cast<uint32_t>(g[i]) & zero);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (Copy) c[i] = static_cast<uint16_t>(pi >> 16);
    if constexpr (Stale) s[i] = pi;
}

// One 64-byte line of every fp32 stream: the chunk of the `lines` form.
constexpr size_t kLine = 16;
// One 64-byte line of every stream, the 16-bit copy-out's included: the chunk of the `nt` form.
constexpr size_t kNtChunk = 32;

// The prefetched form's prefetches for the chunk at i: the kernels' own prefetch_ahead()
// (adam_kernels.hpp), into L2, their default. Of the gradient type only the size matters there.
template <typename G>
[[gnu::always_inline]] inline void prefetch_chunk(uint32_t *p, const G *g, uint32_t *m, uint32_t *v,
                                                  size_t i) {
    constexpr GradType grad = sizeof(G) == 4 ? GradType::f32 : GradType::bf16;
    const opt::detail::Ptrs streams{
        reinterpret_cast<float *>(p), g,       reinterpret_cast<float *>(m),
        reinterpret_cast<float *>(v), nullptr, nullptr};
    opt::detail::prefetch_ahead<kNtChunk, grad, Prefetch::l2>(streams, i);
}

// The streams read and written back, for K elements: param and moments, and the gradient read
// into v's bits. Each stream is its own loop, one after the other, as a chunk of the forms below.
template <size_t K, typename G>
[[gnu::always_inline]] inline void in_place(uint32_t *__restrict p, const G *__restrict g,
                                            uint32_t *__restrict m, uint32_t *__restrict v,
                                            uint32_t zero) {
#pragma omp simd
    for (size_t k = 0; k < K; ++k)
        p[k] ^= zero;
#pragma omp simd
    for (size_t k = 0; k < K; ++k)
        m[k] ^= zero;
#pragma omp simd
    for (size_t k = 0; k < K; ++k)
        v[k] ^= static_cast<uint32_t>(g[k]) & zero;
}

// Stores the 64-byte line at `s` to `d` (both 64-byte aligned) with the ISA's non-temporal store;
// elsewhere than x86-64 with a plain copy (the Arm kernels write with plain stores too).
#if defined(__x86_64__)
[[gnu::target("avx512f"), gnu::always_inline]] inline void nt_line_avx512(void *d, const void *s) {
    _mm512_stream_si512(static_cast<__m512i *>(d), _mm512_load_si512(s));
}
[[gnu::target("avx2"), gnu::always_inline]] inline void nt_line_avx2(void *d, const void *s) {
    for (int k = 0; k < 2; ++k)
        _mm256_stream_si256(static_cast<__m256i *>(d) + k,
                            _mm256_load_si256(static_cast<const __m256i *>(s) + k));
}
[[gnu::always_inline]] inline void nt_line_default(void *d, const void *s) {
    for (int k = 0; k < 4; ++k)
        _mm_stream_si128(static_cast<__m128i *>(d) + k,
                         _mm_load_si128(static_cast<const __m128i *>(s) + k));
}
[[gnu::always_inline]] inline void nt_fence() {
    _mm_sfence();
}
#else
[[gnu::always_inline]] inline void nt_line_default(void *d, const void *s) {
    std::memcpy(d, s, 64);
}
[[gnu::always_inline]] inline void nt_fence() {}
#endif

// Elements before the first whose write-only output (the copy-out, else stale) starts a line.
template <bool Copy, bool Stale> size_t to_line(const uint16_t *c, const uint32_t *s, size_t n) {
    const auto addr = reinterpret_cast<uintptr_t>(Copy ? static_cast<const void *>(c) : s);
    const size_t size = Copy ? 2 : 4, head = (64 - addr % 64) % 64 / size;
    return !Copy && !Stale ? 0 : head < n ? head : n;
}

// Writes `bytes` (a multiple of 64) from the aligned `src` to `dst`: non-temporally when `dst` is
// 64-byte aligned (it is whenever copy-out and stale start at the same offset in a line).
#define ZF_NT_WRITE(LINE, dst, src, bytes)                                                         \
    do {                                                                                           \
        if (reinterpret_cast<uintptr_t>(dst) % 64 == 0)                                            \
            for (size_t b = 0; b < (bytes); b += 64)                                               \
                LINE(reinterpret_cast<char *>(dst) + b, reinterpret_cast<const char *>(src) + b);  \
        else                                                                                       \
            std::memcpy(dst, src, bytes);                                                          \
    } while (0)

// Every form for one target; ATTR is its target attribute, LINE its non-temporal line store.
#define ZF_ROOF(NAME, ATTR, LINE)                                                                  \
    template <typename G, bool Copy, bool Stale>                                                   \
    ATTR void NAME##_simd(uint32_t *__restrict p, const G *__restrict g, uint32_t *__restrict m,   \
                          uint32_t *__restrict v, uint16_t *__restrict c, uint32_t *__restrict s,  \
                          size_t n, uint32_t zero) {                                               \
        _Pragma("omp simd") for (size_t i = 0; i < n; ++i)                                         \
            element<G, Copy, Stale>(p, g, m, v, c, s, i, zero);                                    \
    }                                                                                              \
    template <typename G, bool Copy, bool Stale>                                                   \
    ATTR void NAME##_lines(uint32_t *__restrict p, const G *__restrict g, uint32_t *__restrict m,  \
                           uint32_t *__restrict v, uint16_t *__restrict c, uint32_t *__restrict s, \
                           size_t n, uint32_t zero) {                                              \
        size_t i = 0;                                                                              \
        for (; i + kLine <= n; i += kLine) {                                                       \
            in_place<kLine>(p + i, g + i, m + i, v + i, zero);                                     \
            if constexpr (Copy) {                                                                  \
                _Pragma("omp simd") for (size_t k = i; k < i + kLine; ++k) c[k] =                  \
                    static_cast<uint16_t>(p[k] >> 16);                                             \
            }                                                                                      \
            if constexpr (Stale) {                                                                 \
                _Pragma("omp simd") for (size_t k = i; k < i + kLine; ++k) s[k] = p[k];            \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; ++i)                                                                         \
            element<G, Copy, Stale>(p, g, m, v, c, s, i, zero);                                    \
    }                                                                                              \
    template <typename G, bool Copy, bool Stale, bool Prefetch = false>                            \
    ATTR void NAME##_nt(uint32_t *__restrict p, const G *__restrict g, uint32_t *__restrict m,     \
                        uint32_t *__restrict v, uint16_t *__restrict c, uint32_t *__restrict s,    \
                        size_t n, uint32_t zero) {                                                 \
        size_t i = 0;                                                                              \
        for (const size_t head = to_line<Copy, Stale>(c, s, n); i < head; ++i)                     \
            element<G, Copy, Stale>(p, g, m, v, c, s, i, zero);                                    \
        for (; i + kNtChunk <= n; i += kNtChunk) {                                                 \
            if constexpr (Prefetch) prefetch_chunk(p, g, m, v, i);                                 \
            in_place<kNtChunk>(p + i, g + i, m + i, v + i, zero);                                  \
            if constexpr (Copy) {                                                                  \
                alignas(64) uint16_t line[kNtChunk];                                               \
                _Pragma("omp simd") for (size_t k = 0; k < kNtChunk; ++k) line[k] =                \
                    static_cast<uint16_t>(p[i + k] >> 16);                                         \
                ZF_NT_WRITE(LINE, c + i, line, sizeof line);                                       \
            }                                                                                      \
            if constexpr (Stale) {                                                                 \
                alignas(64) uint32_t lines[kNtChunk];                                              \
                _Pragma("omp simd") for (size_t k = 0; k < kNtChunk; ++k) lines[k] = p[i + k];     \
                ZF_NT_WRITE(LINE, s + i, lines, sizeof lines);                                     \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; ++i)                                                                         \
            element<G, Copy, Stale>(p, g, m, v, c, s, i, zero);                                    \
        if constexpr (Copy || Stale) nt_fence();                                                   \
    }
#if defined(__x86_64__)
ZF_ROOF(pass_avx512, [[gnu::target("avx512f")]], nt_line_avx512)
ZF_ROOF(pass_avx2, [[gnu::target("avx2")]], nt_line_avx2)
#endif
ZF_ROOF(pass_default, , nt_line_default)
#undef ZF_ROOF

template <typename G, bool Copy, bool Stale>
void run(const AdamTensor &t, size_t lo, size_t hi, Isa isa, RoofForm form) {
    auto *p = reinterpret_cast<uint32_t *>(t.param) + lo;
    const auto *g = static_cast<const G *>(t.grad) + lo;
    auto *m = reinterpret_cast<uint32_t *>(t.exp_avg) + lo;
    auto *v = reinterpret_cast<uint32_t *>(t.exp_avg_sq) + lo;
    auto *c = Copy ? static_cast<uint16_t *>(t.copy_out) + lo : nullptr;
    auto *s = Stale ? reinterpret_cast<uint32_t *>(t.stale) + lo : nullptr;
    const size_t n = hi - lo;
    uint32_t zero = 0;
    asm("" : "+r"(zero)); // the compiler no longer knows it is 0
    // One target's forms, indexed by RoofForm.
#define ZF_FORMS(NAME)                                                                             \
    {                                                                                              \
        NAME##_simd<G, Copy, Stale>, NAME##_lines<G, Copy, Stale>, NAME##_nt<G, Copy, Stale>,      \
            NAME##_nt<G, Copy, Stale, true>                                                        \
    }
    using Pass = void (*)(uint32_t *, const G *, uint32_t *, uint32_t *, uint16_t *, uint32_t *,
                          size_t, uint32_t);
    static constexpr Pass baseline[] = ZF_FORMS(pass_default);
#if defined(__x86_64__)
    static constexpr Pass avx512[] = ZF_FORMS(pass_avx512), avx2[] = ZF_FORMS(pass_avx2);
    const Pass *forms = isa == Isa::avx512 ? avx512 : isa == Isa::avx2 ? avx2 : baseline;
#else
    const Pass *forms = baseline; // the compiler's vectors for the baseline (NEON on aarch64)
    (void)isa;
#endif
#undef ZF_FORMS
    forms[static_cast<size_t>(form)](p, g, m, v, c, s, n, zero);
}

template <typename G>
void run_grad(const AdamTensor &t, bool copy, size_t lo, size_t hi, Isa isa, RoofForm form) {
    const bool stale = t.stale != nullptr;
    if (copy && stale)
        run<G, true, true>(t, lo, hi, isa, form);
    else if (copy)
        run<G, true, false>(t, lo, hi, isa, form);
    else if (stale)
        run<G, false, true>(t, lo, hi, isa, form);
    else
        run<G, false, false>(t, lo, hi, isa, form);
}

} // namespace

const char *roof_form_name(RoofForm f) {
    static constexpr const char *names[] = {"simd", "lines", "nt", "prefetched"}; // by RoofForm
    return names[static_cast<size_t>(f)];
}

void stream_pass(const AdamTensor &t, GradType g, CopyType c, size_t lo, size_t hi, Isa isa,
                 RoofForm form) {
    const bool copy = c != CopyType::none;
    if (g == GradType::f32)
        run_grad<uint32_t>(t, copy, lo, hi, isa, form);
    else
        run_grad<uint16_t>(t, copy, lo, hi, isa, form);
}

} // namespace zb::opt::bench
