// Internal contract between the dispatcher (adam_dispatch.cpp) and the per-ISA kernels
// (adam_scalar.cpp; adam_avx2.cpp, adam_avx512.cpp on x86-64; adam_neon.cpp, adam_sve.cpp on
// aarch64). Every kernel performs exactly this sequence
// of IEEE fp32 operations on each element, which is what makes all paths give the same bits:
//
//   g  = grad * grad_scale                      (counted when not finite)
//   p  = p * decay                               (AdamW)   or   g = fma(l2, p, g)   (Adam)
//   m  = fma(one_minus_beta1, g, beta1 * m)
//   v  = fma(one_minus_beta2 * g, g, beta2 * v)
//   d  = fma(sqrt(v), inv_bias2_sqrt, eps)
//   p  = fma(neg_step_size, m / d, p)
//
// sqrt and division are the correctly rounded IEEE ones, and no kernel may contract anything else
// into an FMA (the kernels are compiled with -ffp-contract=off).
#pragma once

#include <zbadam/adam.hpp>
#include <zbadam/prefetch.hpp>

#include <cstring>

namespace zb::opt::detail {

// Per-tensor constants, computed once per call in double and rounded to float.
struct Consts {
    float grad_scale;
    float decay; // 1 - lr * weight_decay for AdamW, else 1
    float l2;    // weight_decay for Adam, else 0
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float neg_step_size;  // -lr / (1 - beta1^step)
    float inv_bias2_sqrt; // 1 / sqrt(1 - beta2^step)
    float eps;
    bool adamw;
    bool stream_out;   // copy-out and stale may take non-temporal stores (set per batch, not hyper)
    Prefetch prefetch; // where the vector loop prefetches (prefetch_ahead; per batch, not hyper)
};

Consts make_consts(const AdamHyper &h);

// Updates elements [lo, hi) of one tensor; returns the count of non-finite scaled gradients.
using RangeKernel = uint64_t (*)(const AdamTensor &t, const Consts &c, GradType g, CopyType cp,
                                 size_t lo, size_t hi);
uint64_t range_scalar(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi);
uint64_t range_avx2(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi);
uint64_t range_avx512(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi);
uint64_t range_neon(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                    size_t hi);
uint64_t range_sve(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                   size_t hi);
size_t sve_bytes(); // this thread's SVE vector length in bytes (SVE CPUs only)

// Whether the vector loop writes t's copy-out and stale streams with non-temporal stores: asked
// for, something to write, and element 0 of each stream 64-byte aligned, so that every W-element
// block from a multiple of W is whole aligned vectors (W is a multiple of two vectors' lanes). Such
// stores fill each line within one or two iterations and skip reading it first; the streams that
// are read and written (param, moments) keep plain stores, which were slower as non-temporal ones.
inline bool streams_out(const AdamTensor &t, const Consts &c, CopyType cp) {
    const auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
    if (!c.stream_out || (cp == CopyType::none && !t.stale)) return false;
    return (cp == CopyType::none || aligned(t.copy_out)) && (!t.stale || aligned(t.stale));
}

// The last hi - i < W elements of a tensor: copied into zero-padded W-wide buffers, run through the
// same vector body as every other element (so they take the same arithmetic and give the same
// bits), and copied back. body(ptrs, r) updates elements [0, W) of ptrs and returns how many of
// the first r have a non-finite gradient.
template <size_t W, GradType G, CopyType C, class Body>
uint64_t padded_tail(const AdamTensor &t, size_t i, size_t hi, Body &&body) {
    const size_t r = hi - i;
    if (r == 0) return 0;
    constexpr size_t gsize = G == GradType::f32 ? 4 : 2;
    alignas(64) float p[W] = {}, m[W] = {}, v[W] = {}, s[W];
    alignas(64) unsigned char g[W * 4] = {};
    alignas(64) uint16_t cp[W];
    std::memcpy(p, t.param + i, r * 4);
    std::memcpy(m, t.exp_avg + i, r * 4);
    std::memcpy(v, t.exp_avg_sq + i, r * 4);
    std::memcpy(g, static_cast<const unsigned char *>(t.grad) + i * gsize, r * gsize);
    const uint64_t bad = body(Ptrs{p, g, m, v, cp, s}, r);
    std::memcpy(t.param + i, p, r * 4);
    std::memcpy(t.exp_avg + i, m, r * 4);
    std::memcpy(t.exp_avg_sq + i, v, r * 4);
    if constexpr (C != CopyType::none)
        std::memcpy(static_cast<uint16_t *>(t.copy_out) + i, cp, r * 2);
    if (t.stale) std::memcpy(t.stale + i, s, r * 4);
    return bad;
}

// Turns the run-time element types into the kernel instantiation run.operator()<G, C>(): the
// one place every ISA's entry point maps (grad, copy) to template arguments.
template <class Run> uint64_t dispatch_types(GradType g, CopyType cp, Run &&run) {
    const auto with_copy = [&]<GradType G>() -> uint64_t {
        switch (cp) {
        case CopyType::bf16:
            return run.template operator()<G, CopyType::bf16>();
        case CopyType::f16:
            return run.template operator()<G, CopyType::f16>();
        default:
            return run.template operator()<G, CopyType::none>();
        }
    };
    switch (g) {
    case GradType::bf16:
        return with_copy.template operator()<GradType::bf16>();
    case GradType::f16:
        return with_copy.template operator()<GradType::f16>();
    default:
        return with_copy.template operator()<GradType::f32>();
    }
}

// Turns the per-tensor switches into template arguments run.operator()<AdamW, Stale, Stream>(),
// so the vector loops carry no branch on them.
template <class Run> uint64_t dispatch_flags(bool adamw, bool stale, bool stream, Run &&run) {
    const auto with_stream = [&]<bool AdamW, bool Stale>() -> uint64_t {
        return stream ? run.template operator()<AdamW, Stale, true>()
                      : run.template operator()<AdamW, Stale, false>();
    };
    if (adamw)
        return stale ? with_stream.template operator()<true, true>()
                     : with_stream.template operator()<true, false>();
    return stale ? with_stream.template operator()<false, true>()
                 : with_stream.template operator()<false, false>();
}

// Iterations [i, end) of the vector loop, each preceded by prefetch_ahead() unless P is off (a
// template argument, so that the loop carries no test of it).
template <class K, GradType G, CopyType C, bool AdamW, bool Stale, bool Stream, Prefetch P>
[[gnu::always_inline]] inline void iterate(const Ptrs &ptrs, const typename K::Vc &c, size_t i,
                                           size_t end, typename K::Count &count) {
    for (; i < end; i += K::W) {
        if constexpr (P != Prefetch::off) prefetch_ahead<K::W, G, P>(ptrs, i);
        typename K::Bad b;
        K::template body<G, C, AdamW, Stale, Stream>(ptrs, c, i, b);
        K::add(count, b);
    }
}

// The loop the fixed-width vector paths run over elements [lo, hi) of one tensor. K is the path's
// kernel (adam_avx2.cpp, adam_avx512.cpp, adam_neon.cpp), compiled with its own target flags:
//   K::W                                  elements per iteration (a multiple of two vectors' lanes)
//   K::Vc                                 the constants in registers, made from Consts
//   K::Bad, K::Count                      one iteration's non-finite lanes; per-lane counters
//   K::body<G, C, AdamW, Stale, Stream>(ptrs, vc, i, bad)   updates elements [i, i + W)
//   K::zero(), K::add(count, bad), K::sum(count), K::fence()
//   K::count(bad, r)                      how many of the first r elements are non-finite
// The counters are summed once per block of 2^28 elements, so neither a lane nor the sum can
// overflow. Streaming stores start at a multiple of W (the elements before it take the padded
// path, as the tail does) and are fenced before returning, so whoever reads the results next sees
// them.
template <class K, GradType G, CopyType C, bool AdamW, bool Stale, bool Stream>
uint64_t run_range(const AdamTensor &t, const Consts &consts, size_t lo, size_t hi) {
    constexpr size_t W = K::W, kBlock = (size_t{1} << 28) / W; // iterations
    const Ptrs ptrs{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.copy_out, t.stale};
    const typename K::Vc c(consts);
    const auto padded = [&c](const Ptrs &p, size_t r) {
        typename K::Bad b;
        K::template body<G, C, AdamW, Stale, false>(p, c, 0, b);
        return K::count(b, r);
    };
    uint64_t bad = 0;
    size_t i = lo;
    if constexpr (Stream) {
        i = (lo + W - 1) / W * W < hi ? (lo + W - 1) / W * W : hi;
        bad += padded_tail<W, G, C>(t, lo, i, padded);
    }
    while (hi - i >= W) {
        const size_t end = i + W * ((hi - i) / W < kBlock ? (hi - i) / W : kBlock);
        typename K::Count count = K::zero();
        if (consts.prefetch == Prefetch::l2)
            iterate<K, G, C, AdamW, Stale, Stream, Prefetch::l2>(ptrs, c, i, end, count);
        else if (consts.prefetch == Prefetch::l1)
            iterate<K, G, C, AdamW, Stale, Stream, Prefetch::l1>(ptrs, c, i, end, count);
        else
            iterate<K, G, C, AdamW, Stale, Stream, Prefetch::off>(ptrs, c, i, end, count);
        i = end;
        bad += K::sum(count);
    }
    bad += padded_tail<W, G, C>(t, i, hi, padded);
    if constexpr (Stream) K::fence();
    return bad;
}

// A vector path's RangeKernel: the run-time types and switches made template arguments.
template <class K>
uint64_t range(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
               size_t hi) {
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() {
        return dispatch_flags(c.adamw, t.stale != nullptr, streams_out(t, c, C),
                              [&]<bool AdamW, bool Stale, bool Stream>() {
                                  return run_range<K, G, C, AdamW, Stale, Stream>(t, c, lo, hi);
                              });
    });
}

} // namespace zb::opt::detail
