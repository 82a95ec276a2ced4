// zenflow-bench's roofline pass: it must make the kernel's memory traffic and nothing else. Over
// every ISA this CPU has, every form, gradient and copy-out type, with and without stale, on
// slices with odd ends, with stale at the copy-out's offset in a line and at another (the `nt` form
// streams whole lines only where a stream's line starts): param, moments and gradients keep their
// bits, stale receives the params and the copy-out their high halves for every element of the slice
// (tails included), and nothing outside the slice is written.
#include "roofline.hpp"

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

using zb::opt::CopyType;
using zb::opt::GradType;
using zb::opt::Isa;

constexpr uint32_t kStaleFill = 0xdeadbeefu;
constexpr uint16_t kCopyFill = 0xbeefu;

// Every buffer starts a 64-byte line, as large allocations do.
template <class T> struct Lines {
    using value_type = T;
    Lines() = default;
    template <class U> explicit Lines(const Lines<U> &) {}
    T *allocate(size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), kAlign)); }
    void deallocate(T *p, size_t) { ::operator delete(p, kAlign); }
    bool operator==(const Lines &) const = default;
    static constexpr std::align_val_t kAlign{64};
};
template <class T> using Vec = std::vector<T, Lines<T>>;

struct Buffers {
    Vec<float> param, m, v, stale; // stale has one element more: room to start it off the line
    Vec<uint32_t> grad;            // room for either gradient width
    Vec<uint16_t> copy;

    explicit Buffers(size_t n) : param(n), m(n), v(n), stale(n + 1), grad(n), copy(n, kCopyFill) {
        uint32_t x = 0x12345678u;
        const auto next = [&x] { return x = x * 1664525u + 1013904223u; };
        for (size_t i = 0; i < n; ++i) {
            uint32_t a = next(), b = next(), c = next();
            std::memcpy(&param[i], &a, 4);
            std::memcpy(&m[i], &b, 4);
            std::memcpy(&v[i], &c, 4);
            grad[i] = next();
        }
        const uint32_t fill = kStaleFill;
        for (float &s : stale)
            std::memcpy(&s, &fill, 4);
    }
};

// The roofline's forms and the diagnostic prefetched pass.
using zb::opt::bench::RoofForm;
constexpr RoofForm kEveryForm[] = {RoofForm::simd, RoofForm::lines, RoofForm::nt,
                                   RoofForm::prefetched};

void test_pass_keeps_data_and_writes_outputs(void **) {
    const size_t n = 1000 + 7;
    const size_t bounds[][2] = {{0, n}, {3, n - 5}, {16, 16 + 31}, {5, 6}, {n, n}};
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon, Isa::sve}) {
        if (!zb::opt::isa_supported(isa)) continue;
        for (GradType g : {GradType::f32, GradType::bf16})
            for (CopyType c : {CopyType::none, CopyType::bf16})
                for (bool stale : {false, true})
                    for (RoofForm form : kEveryForm)
                        for (const auto &b : bounds)
                            // stale at the copy-out's offset in a line, then at another
                            for (size_t shift : {0, 1}) {
                                Buffers buf(n);
                                const Buffers before(n);
                                zb::opt::AdamTensor t;
                                t.param = buf.param.data();
                                t.grad = buf.grad.data();
                                t.exp_avg = buf.m.data();
                                t.exp_avg_sq = buf.v.data();
                                t.copy_out = c == CopyType::none ? nullptr : buf.copy.data();
                                t.stale = stale ? buf.stale.data() + shift : nullptr;
                                t.n = n;
                                zb::opt::bench::stream_pass(t, g, c, b[0], b[1], isa, form);
                                assert_memory_equal(buf.param.data(), before.param.data(), 4 * n);
                                assert_memory_equal(buf.m.data(), before.m.data(), 4 * n);
                                assert_memory_equal(buf.v.data(), before.v.data(), 4 * n);
                                assert_memory_equal(buf.grad.data(), before.grad.data(), 4 * n);
                                for (size_t i = 0; i < n; ++i) {
                                    const bool inside = i >= b[0] && i < b[1];
                                    uint32_t s;
                                    std::memcpy(&s, &buf.stale[i + shift], 4);
                                    uint32_t p;
                                    std::memcpy(&p, &buf.param[i], 4);
                                    assert_int_equal(s, stale && inside ? p : kStaleFill);
                                    if (!inside || c == CopyType::none)
                                        assert_int_equal(buf.copy[i], kCopyFill);
                                    else
                                        assert_int_equal(buf.copy[i], p >> 16);
                                }
                            }
    }
}

} // namespace

int main() {
    const CMUnitTest tests[] = {cmocka_unit_test(test_pass_keeps_data_and_writes_outputs)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
