// Scalar bf16/fp16 <-> fp32 conversions, bit-identical to what the vector paths do: bf16 rounds to
// nearest even with NaNs kept quiet (integer arithmetic, so denormals are kept, unlike
// VCVTNEPS2BF16); fp16 follows F16C (VCVTPS2PH with round-to-nearest-even, VCVTPH2PS).
#pragma once

#include <cstdint>
#include <cstring>

namespace zb::opt::detail {

inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float bf16_to_float(uint16_t h) {
    return bits_float(static_cast<uint32_t>(h) << 16);
}

inline uint16_t float_to_bf16(float f) {
    const uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
    // Subnormal or zero: mant * 2^-24 is exact in float.
    const float mag = static_cast<float>(mant) * bits_float(0x33800000u);
    return bits_float(sign | float_bits(mag));
}

inline uint16_t float_to_f16(float f) {
    uint32_t u = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((u >> 13) & 0x3ffu);
    if (u >= 0x477ff000u) return sign | 0x7c00u; // rounds to infinity (65520 and above)
    if (u < 0x38800000u) {
        // Below the smallest normal half: adding 0.5 puts the half subnormal ulp (2^-24) at the
        // float ulp, so the FPU's round-to-nearest-even does the rounding.
        const float t = bits_float(u) + 0.5f;
        return sign | static_cast<uint16_t>(float_bits(t) - 0x3f000000u);
    }
    u += 0xc8000fffu + ((u >> 13) & 1u); // rebias the exponent and round to nearest even
    return sign | static_cast<uint16_t>(u >> 13);
}

} // namespace zb::opt::detail
