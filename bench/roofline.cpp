#include "roofline.hpp"

#include "adam_kernels.hpp"

namespace zf::bench {
namespace {

// W lanes of GCC's vector extension: each target below compiles them to its own registers (zmm,
// ymm, xmm), so the pass makes the kernel's loads and stores at the kernel's width.
template <size_t W, typename G> struct Lanes {
    typedef uint32_t f32 __attribute__((vector_size(4 * W)));
    typedef unsigned char grad __attribute__((vector_size(sizeof(G) * W)));
};

// The memory traffic of one Adam step, without its arithmetic. An empty asm takes every loaded
// value and hands it back as unknown, so the compiler can neither drop a load nor prove a store
// redundant, and no bit changes: param and moments read and written back, the gradient read, the
// copy-out (the low bytes of the param vector: its value does not matter) and stale written.
template <size_t W, typename G, bool Copy, bool Stale>
[[gnu::always_inline]] inline void block(uint32_t *p, const G *g, uint32_t *m, uint32_t *v,
                                         uint16_t *c, uint32_t *s, size_t i) {
    typename Lanes<W, G>::f32 pv, mv, vv;
    typename Lanes<W, G>::grad gv;
    __builtin_memcpy(&pv, p + i, sizeof pv);
    __builtin_memcpy(&mv, m + i, sizeof mv);
    __builtin_memcpy(&vv, v + i, sizeof vv);
    __builtin_memcpy(&gv, g + i, sizeof gv);
    asm volatile("" : "+v"(pv), "+v"(mv), "+v"(vv) : "v"(gv));
    __builtin_memcpy(p + i, &pv, sizeof pv);
    __builtin_memcpy(m + i, &mv, sizeof mv);
    __builtin_memcpy(v + i, &vv, sizeof vv);
    if constexpr (Copy) __builtin_memcpy(c + i, &pv, 2 * W);
    if constexpr (Stale) __builtin_memcpy(s + i, &pv, sizeof pv);
}

// Blocks of 32 elements, as the kernels take them; with Prefetch, each block first reads ahead as
// the kernels do (detail::prefetch32). Which of the two passes streams faster depends on the
// machine and the configuration, so the benchmark runs both and holds the kernel to the faster.
template <size_t W, typename G, bool Copy, bool Stale, bool Prefetch>
[[gnu::always_inline]] inline void pass(uint32_t *p, const G *g, uint32_t *m, uint32_t *v,
                                        uint16_t *c, uint32_t *s, size_t n) {
    constexpr GradType gt = sizeof(G) == 4 ? GradType::f32 : GradType::bf16;
    const detail::Ptrs ptrs{reinterpret_cast<float *>(p), g, reinterpret_cast<float *>(m),
                            reinterpret_cast<float *>(v), c, reinterpret_cast<float *>(s)};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if constexpr (Prefetch) detail::prefetch32<gt>(ptrs, i);
        for (size_t k = 0; k < 32; k += W)
            block<W, G, Copy, Stale>(p, g, m, v, c, s, i + k);
    }
    for (; i < n; ++i) { // the last slice's tail, below 32 elements
        uint32_t pi = p[i], mi = m[i], vi = v[i];
        asm volatile("" : "+r"(pi), "+r"(mi), "+r"(vi) : "r"(g[i]));
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if constexpr (Copy) c[i] = static_cast<uint16_t>(pi);
        if constexpr (Stale) s[i] = pi;
    }
}

#define ZF_ROOF(NAME, W, ATTR)                                                                     \
    template <typename G, bool Copy, bool Stale, bool Prefetch>                                    \
    ATTR void NAME(uint32_t *p, const G *g, uint32_t *m, uint32_t *v, uint16_t *c, uint32_t *s,    \
                   size_t n) {                                                                     \
        pass<W, G, Copy, Stale, Prefetch>(p, g, m, v, c, s, n);                                    \
    }
ZF_ROOF(pass_avx512, 16, [[gnu::target("avx512f")]])
ZF_ROOF(pass_avx2, 8, [[gnu::target("avx2")]])
ZF_ROOF(pass_default, 4, )
#undef ZF_ROOF

template <typename G, bool Copy, bool Stale, bool Prefetch>
void run(const AdamTensor &t, size_t lo, size_t hi, Isa isa) {
    auto *p = reinterpret_cast<uint32_t *>(t.param) + lo;
    const auto *g = static_cast<const G *>(t.grad) + lo;
    auto *m = reinterpret_cast<uint32_t *>(t.exp_avg) + lo;
    auto *v = reinterpret_cast<uint32_t *>(t.exp_avg_sq) + lo;
    auto *c = Copy ? static_cast<uint16_t *>(t.copy_out) + lo : nullptr;
    auto *s = Stale ? reinterpret_cast<uint32_t *>(t.stale) + lo : nullptr;
    const size_t n = hi - lo;
    if (isa == Isa::avx512)
        pass_avx512<G, Copy, Stale, Prefetch>(p, g, m, v, c, s, n);
    else if (isa == Isa::avx2)
        pass_avx2<G, Copy, Stale, Prefetch>(p, g, m, v, c, s, n);
    else
        pass_default<G, Copy, Stale, Prefetch>(p, g, m, v, c, s, n);
}

template <typename G, bool Prefetch>
void run_grad(const AdamTensor &t, bool copy, size_t lo, size_t hi, Isa isa) {
    const bool stale = t.stale != nullptr;
    if (copy && stale)
        run<G, true, true, Prefetch>(t, lo, hi, isa);
    else if (copy)
        run<G, true, false, Prefetch>(t, lo, hi, isa);
    else if (stale)
        run<G, false, true, Prefetch>(t, lo, hi, isa);
    else
        run<G, false, false, Prefetch>(t, lo, hi, isa);
}

} // namespace

void stream_pass(const AdamTensor &t, GradType g, CopyType c, size_t lo, size_t hi, Isa isa,
                 bool prefetch) {
    const bool copy = c != CopyType::none, f32 = g == GradType::f32;
    if (f32 && prefetch)
        run_grad<uint32_t, true>(t, copy, lo, hi, isa);
    else if (f32)
        run_grad<uint32_t, false>(t, copy, lo, hi, isa);
    else if (prefetch)
        run_grad<uint16_t, true>(t, copy, lo, hi, isa);
    else
        run_grad<uint16_t, false>(t, copy, lo, hi, isa);
}

} // namespace zf::bench
