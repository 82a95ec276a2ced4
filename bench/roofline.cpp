#include "roofline.hpp"

namespace zf::bench {
namespace {

// The loop is plain integer code that the compiler vectorises for each target below; the XOR with
// a run-time zero keeps every load and store without changing a bit.
template <typename G, bool Copy, bool Stale>
[[gnu::always_inline]] inline void
pass(uint32_t *__restrict p, const G *__restrict g, uint32_t *__restrict m, uint32_t *__restrict v,
     uint16_t *__restrict c, uint32_t *__restrict s, size_t n, uint32_t zero) {
    for (size_t i = 0; i < n; ++i) {
        const uint32_t pi = p[i] ^ (m[i] & zero), mi = m[i] ^ (v[i] & zero);
        const uint32_t vi = v[i] ^ (static_cast<uint32_t>(g[i]) & zero);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if constexpr (Copy) c[i] = static_cast<uint16_t>(pi >> 16);
        if constexpr (Stale) s[i] = pi;
    }
}

#define ZF_ROOF(NAME, ATTR)                                                                        \
    template <typename G, bool Copy, bool Stale>                                                   \
    ATTR void NAME(uint32_t *p, const G *g, uint32_t *m, uint32_t *v, uint16_t *c, uint32_t *s,    \
                   size_t n, uint32_t zero) {                                                      \
        pass<G, Copy, Stale>(p, g, m, v, c, s, n, zero);                                           \
    }
ZF_ROOF(pass_avx512, [[gnu::target("avx512f,avx512bw")]])
ZF_ROOF(pass_avx2, [[gnu::target("avx2")]])
ZF_ROOF(pass_default, )
#undef ZF_ROOF

template <typename G, bool Copy, bool Stale>
void run(const AdamTensor &t, size_t lo, size_t hi, Isa isa, uint32_t zero) {
    auto *p = reinterpret_cast<uint32_t *>(t.param) + lo;
    const auto *g = static_cast<const G *>(t.grad) + lo;
    auto *m = reinterpret_cast<uint32_t *>(t.exp_avg) + lo;
    auto *v = reinterpret_cast<uint32_t *>(t.exp_avg_sq) + lo;
    auto *c = Copy ? static_cast<uint16_t *>(t.copy_out) + lo : nullptr;
    auto *s = Stale ? reinterpret_cast<uint32_t *>(t.stale) + lo : nullptr;
    const size_t n = hi - lo;
    if (isa == Isa::avx512)
        pass_avx512<G, Copy, Stale>(p, g, m, v, c, s, n, zero);
    else if (isa == Isa::avx2)
        pass_avx2<G, Copy, Stale>(p, g, m, v, c, s, n, zero);
    else
        pass_default<G, Copy, Stale>(p, g, m, v, c, s, n, zero);
}

template <typename G>
void run_grad(const AdamTensor &t, bool copy, size_t lo, size_t hi, Isa isa, uint32_t zero) {
    const bool stale = t.stale != nullptr;
    if (copy && stale)
        run<G, true, true>(t, lo, hi, isa, zero);
    else if (copy)
        run<G, true, false>(t, lo, hi, isa, zero);
    else if (stale)
        run<G, false, true>(t, lo, hi, isa, zero);
    else
        run<G, false, false>(t, lo, hi, isa, zero);
}

} // namespace

void stream_pass(const AdamTensor &t, GradType g, CopyType c, size_t lo, size_t hi, Isa isa,
                 uint32_t zero) {
    const bool copy = c != CopyType::none;
    if (g == GradType::f32)
        run_grad<uint32_t>(t, copy, lo, hi, isa, zero);
    else
        run_grad<uint16_t>(t, copy, lo, hi, isa, zero);
}

} // namespace zf::bench
