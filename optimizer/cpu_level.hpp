// What this CPU and its OS support, which picks the kernels (adam_dispatch.cpp) and the gradient
// pre-pass (grad_stats.cpp).
//
// x86-64: the micro-architecture level: 4 (AVX-512 F, BW, CD, DQ, VL with the ZMM state saved),
// 3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE with the YMM state saved), else 1. Read from CPUID and
// XGETBV directly, so GCC and clang agree: clang before 16 knows neither "x86-64-v4" nor "f16c" in
// __builtin_cpu_supports.
//
// aarch64: Advanced SIMD (NEON) and SVE, as the kernel reports them in the auxiliary vector
// (AT_HWCAP), which says both that the CPU has them and that the kernel saves their state.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace zb::opt {

#if defined(__x86_64__)
inline int x86_level() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 1;
    const unsigned ecx1 = c;
    const bool v3_leaf1 = (ecx1 & bit_FMA) && (ecx1 & bit_MOVBE) && (ecx1 & bit_OSXSAVE) &&
                          (ecx1 & bit_AVX) && (ecx1 & bit_F16C);
    if (!v3_leaf1 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 1;
    const unsigned ebx7 = b;
    unsigned lzcnt_ecx = 0;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d)) lzcnt_ecx = c;
    uint32_t xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool ymm_state = (xcr0_lo & 0x6) == 0x6;
    if (!ymm_state || !(ebx7 & bit_AVX2) || !(ebx7 & bit_BMI) || !(ebx7 & bit_BMI2) ||
        !(lzcnt_ecx & bit_LZCNT))
        return 1;
    const bool zmm_state = (xcr0_lo & 0xe0) == 0xe0;
    const unsigned avx512 = bit_AVX512F | bit_AVX512BW | bit_AVX512CD | bit_AVX512DQ | bit_AVX512VL;
    return zmm_state && (ebx7 & avx512) == avx512 ? 4 : 3;
}
#elif defined(__aarch64__)
inline bool arm_neon() {
    return getauxval(AT_HWCAP) & HWCAP_ASIMD;
}
inline bool arm_sve() {
    return getauxval(AT_HWCAP) & HWCAP_SVE;
}
#endif

} // namespace zb::opt
