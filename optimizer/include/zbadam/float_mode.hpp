// The floating-point mode the kernels and the gradient pre-pass run in, whatever their thread's:
// round to nearest, denormals kept (no flush-to-zero, no denormals-are-zero), as a process
// starts and as torch computes by default. Threads of one team could otherwise differ (a caller's
// torch.set_flush_denormal(True) or fesetround() reaches its own thread only), and a step's bits
// would depend on which thread took which chunk. Each thread of a team holds one IeeeMode; its
// own mode is back when the guard goes. Exception masks are left as they are, and flags the step
// raises stay raised.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zb::opt {

class IeeeMode {
  public:
    IeeeMode() noexcept : saved_(get()) {
        const uint64_t want = saved_ & ~kNonIeee;
        if (want != saved_) set(want);
    }
    ~IeeeMode() { // the mode back; exception flags the step raised stay raised
        if (saved_ & kNonIeee) set((get() & ~kNonIeee) | (saved_ & kNonIeee));
    }
    IeeeMode(const IeeeMode &) = delete;
    IeeeMode &operator=(const IeeeMode &) = delete;

  private:
#if defined(__x86_64__)
    // MXCSR: flush-to-zero (15), rounding control (14:13), denormals-are-zero (6)
    static constexpr uint64_t kNonIeee = (1u << 15) | (3u << 13) | (1u << 6);
    static uint64_t get() noexcept {
        return _mm_getcsr();
    }
    static void set(uint64_t v) noexcept {
        _mm_setcsr(static_cast<unsigned>(v));
    }
#elif defined(__aarch64__)
    // FPCR: alternative half-precision (26), default NaN (25), flush-to-zero (24), rounding mode
    // (23:22), half-precision flush-to-zero (19), FEAT_AFP's AH and FIZ (1:0; zero without it)
    static constexpr uint64_t kNonIeee =
        (1u << 26) | (1u << 25) | (1u << 24) | (3u << 22) | (1u << 19) | 3u;
    static uint64_t get() noexcept {
        uint64_t v;
        asm volatile("mrs %0, fpcr" : "=r"(v));
        return v;
    }
    static void set(uint64_t v) noexcept {
        asm volatile("msr fpcr, %0" : : "r"(v));
    }
#else
    static constexpr uint64_t kNonIeee = 0;
    static uint64_t get() noexcept {
        return 0;
    }
    static void set(uint64_t) noexcept {}
#endif
    uint64_t saved_;
};

} // namespace zb::opt
