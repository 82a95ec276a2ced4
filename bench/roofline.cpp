#include "roofline.hpp"

#include <cstdint>

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

// Every form for one target; ATTR is its target attribute.
#define ZF_ROOF(NAME, ATTR)                                                                        \
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
            _Pragma("omp simd") for (size_t k = i; k < i + kLine; ++k) p[k] ^= zero;               \
            _Pragma("omp simd") for (size_t k = i; k < i + kLine; ++k) m[k] ^= zero;               \
            _Pragma("omp simd") for (size_t k = i; k < i + kLine; ++k) v[k] ^=                     \
                static_cast<uint32_t>(g[k]) & zero;                                                \
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
    }
ZF_ROOF(pass_avx512, [[gnu::target("avx512f")]])
ZF_ROOF(pass_avx2, [[gnu::target("avx2")]])
ZF_ROOF(pass_default, )
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
    { NAME##_simd<G, Copy, Stale>, NAME##_lines<G, Copy, Stale> }
    using Pass = void (*)(uint32_t *, const G *, uint32_t *, uint32_t *, uint16_t *, uint32_t *,
                          size_t, uint32_t);
    static constexpr Pass avx512[] = ZF_FORMS(pass_avx512), avx2[] = ZF_FORMS(pass_avx2),
                          baseline[] = ZF_FORMS(pass_default);
#undef ZF_FORMS
    const Pass *forms = isa == Isa::avx512 ? avx512 : isa == Isa::avx2 ? avx2 : baseline;
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
    return f == RoofForm::lines ? "lines" : "simd";
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
