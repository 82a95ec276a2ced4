// How the Adam kernels prefetch the streams they read: public so that the benchmark's roofline
// (bench/roofline.cpp) can add the very same prefetches to a plain streaming pass.
#pragma once

#include <zbadam/adam.hpp>

#include <cstddef>
#include <cstdint>

namespace zb::opt::detail {

// One tensor's streams as the vector bodies take them (a tail passes padded copies instead).
struct Ptrs {
    float *param;
    const void *grad;
    float *m;
    float *v;
    void *copy;
    float *stale;
};

// Before every loop over the vectors of an iteration: unrolled completely, its arrays of vectors
// live in registers. Left to itself, GCC 12 at the project's flags kept them on the stack and
// copied every input and output through it (AVX-512, four vectors: half the speed).
#define ZB_UNROLL _Pragma("GCC unroll 8")

// How far ahead of the iteration at i the vector loop asks for the lines it will read (param,
// moments, gradient), in elements: 512, 2 KiB of each fp32 stream; and into which cache. Where the
// arithmetic between the loads leaves fewer misses in flight than a plain streaming pass has, and
// the hardware prefetchers do not make up for it, prefetching helps; where they do, it costs. Into
// L2 rather than L1: a prefetch into L1 holds one of the core's few L1 miss buffers until its line
// arrives, and the demand loads and the stores' reads-for-ownership wait for the same buffers; one
// into L2 does not. Whether to prefetch at all is chosen at run time (adam.hpp): the same Zen 4
// guest model has measured either way, and so have two kinds of buffers on one machine (the
// benchmark's own, where L2 took 0.89x the time of none; torch's tensors, where none was the
// faster). Each step alternated in one process on the same buffers, N = 100M (zenflow-bench adam
// --vs-prefetch), with the earlier kernel body that read every stream before writing any:
//   AMD EPYC (Zen 4) guest: into L2 took 0.71-0.92x the time of into L1 on 1 thread and 0.71-0.96x
//     on 2, in each of the 24 configurations (fp32/bf16/fp16 gradients x copy-out none/bf16 x
//     stale, AVX-512 and AVX2), and 0.65-0.81x and 0.63-0.86x the time of no prefetch (four of
//     them). Distances of 256, 1024 and 2048 elements into L2 were no faster than 512.
//   Intel Xeon KVM guest (AVX-512, AMX), into L1 only (into L2 not yet measured there): 256, 512
//     and 1024 elements took 0.94-0.97x the time of no prefetch on 1 thread.
// Which cache is chosen at run time (force_prefetch()); the distance is a constant, so the
// addresses are the loads' plus a displacement: a distance held in registers cost 1-3% with
// AVX-512 on that Intel CPU (1 and 2 threads, paired).
constexpr size_t kPrefetchAhead = 512;

// Prefetches into the cache P names the lines of elements [i + kPrefetchAhead, + W) of the streams
// an iteration reads. Addresses past a tensor's end are harmless: a prefetch never faults (they are
// computed as integers, so no pointer leaves its array).
template <size_t W, GradType G, Prefetch P>
[[gnu::always_inline]] inline void prefetch_ahead(const Ptrs &t, size_t i) {
    static_assert(P != Prefetch::off);
    constexpr size_t gsize = G == GradType::f32 ? 4 : 2;
    // Locality 3 and 2: PREFETCHT0 and PREFETCHT1 on x86-64, PRFM PLDL1KEEP and PLDL2KEEP on Arm.
    constexpr int locality = P == Prefetch::l1 ? 3 : 2;
    const size_t at = i + kPrefetchAhead;
    // (A lambda for the one line would be shorter, but GCC 12 drops the prefetches made in it.)
#define ZB_PREFETCH(base, offset)                                                                  \
    __builtin_prefetch(                                                                            \
        reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(base) + (offset)), 0, locality)
    ZB_UNROLL
    for (size_t b = 0; b < W * 4; b += 64) {
        ZB_PREFETCH(t.param, at * 4 + b);
        ZB_PREFETCH(t.m, at * 4 + b);
        ZB_PREFETCH(t.v, at * 4 + b);
    }
    ZB_UNROLL
    for (size_t b = 0; b < W * gsize; b += 64)
        ZB_PREFETCH(t.grad, at * gsize + b);
#undef ZB_PREFETCH
}

} // namespace zb::opt::detail
