#include "grad_stats.hpp"

#include <cstring>

namespace zf {
namespace {

// Lanes of independent partial sums: element i of a block goes to lane i % kLanes, and the lanes
// are added in one fixed order, so a vectorised and a scalar build of this loop give the same
// bits (no reassociation is allowed without -ffast-math).
constexpr size_t kLanes = 8;

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint32_t to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Branch-free and without denormal arithmetic (slow on x86): normals by rebiasing the exponent
// in the integer domain, subnormals as an exact integer times 2^-24, inf/NaN by forcing the
// exponent to all ones.
float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, mag = h & 0x7fffu;
    const float normal = from_bits((mag << 13) + (112u << 23));
    const float subnormal = float(mag) * 0x1p-24f;
    const float special = from_bits((mag << 13) | 0x7f800000u);
    const float v = mag >= 0x7c00u ? special : (mag >= 0x0400u ? normal : subnormal);
    return from_bits(to_bits(v) | sign);
}

float load(const void *grad, GradType type, size_t i) {
    switch (type) {
    case GradType::bf16:
        return from_bits(uint32_t(static_cast<const uint16_t *>(grad)[i]) << 16);
    case GradType::f16:
        return half_to_float(static_cast<const uint16_t *>(grad)[i]);
    case GradType::f32:
        break;
    }
    return static_cast<const float *>(grad)[i];
}

template <GradType T> GradStats block(const void *grad, size_t lo, size_t hi, float scale) {
    double sum[kLanes] = {};
    uint64_t bad[kLanes] = {};
    size_t i = lo;
    for (; i + kLanes <= hi; i += kLanes)
        for (size_t l = 0; l < kLanes; ++l) {
            const float x = load(grad, T, i + l) * scale;
            const double d = x;
            sum[l] += d * d;
            bad[l] += (to_bits(x) & 0x7f800000u) == 0x7f800000u;
        }
    for (size_t l = 0; i < hi; ++i, ++l) {
        const float x = load(grad, T, i) * scale;
        const double d = x;
        sum[l] += d * d;
        bad[l] += (to_bits(x) & 0x7f800000u) == 0x7f800000u;
    }
    GradStats s;
    s.sum_squares =
        ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
    for (uint64_t b : bad)
        s.nonfinite += b;
    return s;
}

} // namespace

GradStats grad_block_stats(const void *grad, GradType type, size_t lo, size_t hi, float scale) {
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

void grad_stats_share(size_t blocks, int thread, int threads, size_t &lo, size_t &hi) {
    const size_t t = static_cast<size_t>(thread),
                 n = threads > 0 ? static_cast<size_t>(threads) : 1;
    lo = blocks * t / n;
    hi = blocks * (t + 1) / n;
}

GradStats grad_stats_sum(const GradStats *blocks, size_t count) {
    GradStats s;
    for (size_t b = 0; b < count; ++b) {
        s.sum_squares += blocks[b].sum_squares;
        s.nonfinite += blocks[b].nonfinite;
    }
    return s;
}

} // namespace zf
