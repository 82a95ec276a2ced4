// The pre-pass's arithmetic, compiled once per ISA (grad_stats_*.cpp, each with its own -march):
// everything here has internal linkage, so no translation unit can pick up another's instructions.
#pragma once

#include <zbadam/grad_stats.hpp>

#include <cstring>
#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace zb::opt {
namespace {

// Eight lanes of partial sums: element i of a block goes to lane i % 8, and the lanes are added in
// one fixed order at the end. The vector types below are element-wise IEEE operations (and
// -ffp-contract=off forbids fusing them), so every ISA the compiler lowers them to gives the same
// bits as eight scalar lanes.
constexpr size_t kLanes = 8;
typedef float F8 __attribute__((vector_size(32)));
typedef double D4 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));

template <class V> inline V load(const void *p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <class To, class From> inline To bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}

#ifdef __F16C__
// fp16 to fp32 is exact, so the conversion instruction gives the same bits as the integer path.
inline F8 half_to_float(H8 h) {
    return reinterpret_cast<F8>(_mm256_cvtph_ps(reinterpret_cast<__m128i>(h)));
}
#else
// Without denormal arithmetic (slow on x86): normals by rebiasing the exponent in the integer
// domain, subnormals as an exact integer times 2^-24, inf/NaN by forcing the exponent to all ones.
// Signed lanes: the magnitude fits 15 bits, and x86 before AVX-512 compares only signed integers.
inline F8 half_to_float(H8 h) {
    const I8 x = __builtin_convertvector(h, I8);
    const I8 sign = (x & 0x8000) << 16, mag = x & 0x7fff;
    const I8 normal = (mag << 13) + (112 << 23);
    const I8 subnormal = bits<I8>(__builtin_convertvector(mag, F8) * 0x1p-24f);
    const I8 special = (mag << 13) | 0x7f800000;
    const I8 v = mag >= 0x7c00 ? special : (mag >= 0x0400 ? normal : subnormal);
    return bits<F8>(v | sign);
}
#endif

// Lanes 0-3 (Half 0) or 4-7 (Half 1) of x, widened to double (exact). With AVX, one conversion of
// a 128-bit half: GCC 12 lowers the generic form to two 2-lane conversions and four shuffles, and
// with those one thread summed fp32 gradients at 26-27 GB/s on an AMD EPYC (Zen 5) guest, 31-32
// with this, where a plain read loop runs at 40 (100M elements).
template <int Half> inline D4 widen(F8 x) {
#ifdef __AVX__
    const __m256 v = reinterpret_cast<__m256>(x);
    return reinterpret_cast<D4>(
        _mm256_cvtps_pd(Half == 0 ? _mm256_castps256_ps128(v) : _mm256_extractf128_ps(v, 1)));
#else
    return Half == 0 ? __builtin_convertvector(__builtin_shufflevector(x, x, 0, 1, 2, 3), D4)
                     : __builtin_convertvector(__builtin_shufflevector(x, x, 4, 5, 6, 7), D4);
#endif
}

template <GradType T> inline F8 load8(const void *grad, size_t i) {
    if constexpr (T == GradType::f32) {
        return load<F8>(static_cast<const float *>(grad) + i);
    } else if constexpr (T == GradType::bf16) {
        const H8 h = load<H8>(static_cast<const uint16_t *>(grad) + i);
#ifdef __AVX2__
        // One widening instruction: GCC 12 makes the generic conversion two and an insert.
        return bits<F8>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(reinterpret_cast<__m128i>(h)), 16));
#else
        return bits<F8>(__builtin_convertvector(h, U8) << 16);
#endif
    } else {
        return half_to_float(load<H8>(static_cast<const uint16_t *>(grad) + i));
    }
}

// How far ahead of the element it adds the pass asks for the gradients' lines, in elements (4 KiB
// of fp32, 2 KiB of 16-bit gradients). The hardware prefetchers alone kept too few lines in flight
// for the arithmetic between the loads: on an Intel Xeon KVM guest (AVX-512) one thread read fp32
// gradients at 4.0 GB/s, against 13 GB/s for a plain read loop; 256, 512, 1024 and 2048 elements
// ahead gave 7.6, 8.5, 8.9 and 8.8 GB/s (50M elements, in one process). Measured on that CPU only.
// The address is an integer: it may lie past the gradients' end, where a prefetch is harmless.
constexpr size_t kPrefetchAhead = 1024;

template <GradType T> inline GradStats block(const void *grad, size_t lo, size_t hi, float scale) {
    D4 lo4 = {}, hi4 = {}; // lanes 0-3 and 4-7: a vector of eight doubles would be spilled
    I8 bad = {};           // at most kGradStatsBlock / 8 per lane
    auto add = [&](F8 g) {
        const F8 x = g * scale;
        const D4 a = widen<0>(x), b = widen<1>(x);
        lo4 += a * a;
        hi4 += b * b;
        bad -= (bits<U8>(x) & 0x7f800000u) == 0x7f800000u; // true is -1
    };
    constexpr size_t esize = T == GradType::f32 ? 4 : 2;
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(grad) + kPrefetchAhead * esize;
    size_t i = lo;
    for (; i + kLanes <= hi; i += kLanes) {
        __builtin_prefetch(reinterpret_cast<const void *>(ahead + i * esize));
        add(load8<T>(grad, i));
    }
    if (i < hi) {
        // The tail through a zero-padded copy: zeros add nothing to either sum.
        alignas(32) unsigned char tail[kLanes * 4] = {};
        std::memcpy(tail, static_cast<const unsigned char *>(grad) + i * esize, (hi - i) * esize);
        add(load8<T>(tail, 0));
    }
    GradStats s;
    s.sum_squares =
        ((lo4[0] + lo4[1]) + (lo4[2] + lo4[3])) + ((hi4[0] + hi4[1]) + (hi4[2] + hi4[3]));
    for (size_t l = 0; l < kLanes; ++l)
        s.nonfinite += static_cast<uint64_t>(bad[l]);
    return s;
}

inline GradStats block_of_type(const void *grad, GradType type, size_t lo, size_t hi, float scale) {
    switch (type) {
    case GradType::bf16:
        return block<GradType::bf16>(grad, lo, hi, scale);
    case GradType::f16:
        return block<GradType::f16>(grad, lo, hi, scale);
    case GradType::f32:
        break;
    }
    return block<GradType::f32>(grad, lo, hi, scale);
}

} // namespace
} // namespace zb::opt
