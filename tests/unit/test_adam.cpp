// The Adam/AdamW kernels: every ISA path and thread count gives the scalar path's bits; the scalar
// path agrees with a double-precision torch-style reference; non-finite gradients are counted;
// copy-outs are correctly rounded; the gradient scale and both weight decays behave as torch's.
#include "adam_kernels.hpp"
#include "prefetch_choice.hpp"
#include <zbadam/adam.hpp>
#include <zbadam/team_share.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <omp.h>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#if defined(__aarch64__)
#include <sys/prctl.h>
#endif

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

using zb::opt::AdamBatch;
using zb::opt::AdamHyper;
using zb::opt::AdamTensor;
using zb::opt::CopyType;
using zb::opt::GradType;
using zb::opt::Isa;
using zb::opt::Stores;

uint64_t rng_state = 0x9e3779b97f4a7c15ull;

// The SVE vector length of this thread in bytes, from the kernel's prctl (not the auxiliary
// vector the dispatcher reads); 0 without SVE.
size_t sve_vector_bytes() {
#if defined(__aarch64__)
    const int vl = prctl(PR_SVE_GET_VL);
    return vl < 0 ? 0 : static_cast<size_t>(vl & PR_SVE_VL_LEN_MASK);
#else
    return 0;
#endif
}

// The ISAs this CPU and kernel support, independently of the dispatcher's own reading: on x86-64
// /proc/cpuinfo's flags (not CPUID), on aarch64 NEON (every ARMv8 CPU) and SVE where prctl gives a
// vector length (not AT_HWCAP). What every cross-ISA test here compares. Printed once, so a log
// shows when a machine compared fewer.
const std::vector<Isa> &isas() {
    static const std::vector<Isa> list = [] {
        std::vector<Isa> out{Isa::scalar};
#if defined(__x86_64__)
        std::set<std::string> flags;
        std::ifstream in("/proc/cpuinfo");
        for (std::string line; std::getline(in, line);)
            if (line.rfind("flags", 0) == 0) {
                std::istringstream words(line.substr(line.find(':') + 1));
                for (std::string w; words >> w;)
                    flags.insert(w);
                break;
            }
        const auto all = [&](std::initializer_list<const char *> names) {
            for (const char *n : names)
                if (!flags.count(n)) return false;
            return true;
        };
        if (all({"avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"})) {
            out.push_back(Isa::avx2);
            if (all({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}))
                out.push_back(Isa::avx512);
        }
#elif defined(__aarch64__)
        out.push_back(Isa::neon);
        if (sve_vector_bytes()) out.push_back(Isa::sve);
#endif
        std::fprintf(stderr, "test_adam: comparing the ISAs of this CPU:");
        for (Isa isa : out)
            std::fprintf(stderr, " %s", zb::opt::isa_name(isa));
        if (sve_vector_bytes())
            std::fprintf(stderr, " (SVE vectors of %zu bits)", sve_vector_bytes() * 8);
        std::fprintf(stderr, "\n");
        return out;
    }();
    return list;
}

// The kernel best_isa() should pick among isas(): the widest, but NEON over 128-bit SVE.
Isa expected_best() {
    const Isa last = isas().back();
    return last == Isa::sve && sve_vector_bytes() <= 16 ? Isa::neon : last;
}

// Each vector path's RangeKernel, called directly by the tests below.
zb::opt::detail::RangeKernel kernel_of(Isa isa) {
    switch (isa) {
#if defined(__x86_64__)
    case Isa::avx2:
        return zb::opt::detail::range_avx2;
    case Isa::avx512:
        return zb::opt::detail::range_avx512;
#elif defined(__aarch64__)
    case Isa::neon:
        return zb::opt::detail::range_neon;
    case Isa::sve:
        return zb::opt::detail::range_sve;
#endif
    default:
        return zb::opt::detail::range_scalar;
    }
}

// Runs the kernels on `isa` from now on, or fails: no test may believe it ran a kernel it did not.
void use(Isa isa) {
    if (!zb::opt::force_isa(isa))
        fail_msg("this CPU cannot run the %s kernel", zb::opt::isa_name(isa));
}

double uniform() { // [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(rng_state >> 11) * 0x1p-52 - 1.0;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Independent encoders for the test inputs (truncation is fine for inputs: any value will do).
uint16_t bf16_trunc(float f) {
    return static_cast<uint16_t>(bits(f) >> 16);
}

double f16_value(uint16_t h) {
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * std::ldexp(mant, -24);
    return sign * std::ldexp(1024 + mant, exp - 25);
}

double bf16_value(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f16_trunc(float f) { // largest magnitude not above |f| (binary search over the codes)
    const double a = std::fabs(static_cast<double>(f));
    uint16_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
        if (f16_value(mid) <= a)
            lo = mid;
        else
            hi = static_cast<uint16_t>(mid - 1);
    }
    return static_cast<uint16_t>(lo | (f < 0 ? 0x8000 : 0));
}

size_t grad_size(GradType g) {
    return g == GradType::f32 ? 4 : 2;
}

// Buffers start on a 64-byte boundary, as the worker's do, so the streaming stores can run.
template <class T> struct Align64 {
    using value_type = T;
    Align64() = default;
    template <class U> Align64(const Align64<U> &) {}
    T *allocate(size_t n) {
        return static_cast<T *>(::operator new (n * sizeof(T), std::align_val_t{64}));
    }
    void deallocate(T *p, size_t) { ::operator delete (p, std::align_val_t{64}); }
    template <class U> bool operator==(const Align64<U> &) const { return true; }
};
template <class T> using Buf = std::vector<T, Align64<T>>;

// A batch of tensors with its state, copied so every run starts from the same bits.
struct Problem {
    GradType gtype = GradType::f32;
    CopyType ctype = CopyType::none;
    bool stale = false;
    std::vector<size_t> lengths;
    std::vector<Buf<float>> param, m, v, stale_out;
    std::vector<Buf<unsigned char>> grad;
    std::vector<Buf<uint16_t>> copy;
    std::vector<AdamHyper> hypers;

    Problem(std::vector<size_t> lens, GradType g, CopyType c, bool s)
        : gtype(g), ctype(c), stale(s), lengths(std::move(lens)) {
        hypers.resize(3);
        hypers[0].weight_decay = 0.01f; // AdamW
        hypers[1].adamw = false;        // Adam with L2
        hypers[1].weight_decay = 0.1f;
        hypers[1].grad_scale = 0.5f;
        hypers[2].bias_correction = false;
        hypers[2].lr = 3e-2f;
        hypers[2].grad_scale = 1.0f / 1024;
        for (size_t n : lengths) {
            param.emplace_back(n);
            m.emplace_back(n);
            v.emplace_back(n);
            stale_out.emplace_back(s ? n : 0);
            copy.emplace_back(c == CopyType::none ? 0 : n);
            grad.emplace_back(n * grad_size(g));
            for (size_t i = 0; i < n; ++i) {
                param.back()[i] = static_cast<float>(uniform());
                m.back()[i] = static_cast<float>(uniform() * 1e-2);
                v.back()[i] = static_cast<float>(std::fabs(uniform()) * 1e-4);
            }
        }
        new_grads();
    }

    void new_grads() {
        for (size_t k = 0; k < lengths.size(); ++k)
            for (size_t i = 0; i < lengths[k]; ++i) {
                const float x = static_cast<float>(uniform() * (i % 5 == 0 ? 1e-6 : 1e-1));
                unsigned char *dst = grad[k].data() + i * grad_size(gtype);
                if (gtype == GradType::f32)
                    std::memcpy(dst, &x, 4);
                else {
                    const uint16_t h = gtype == GradType::bf16 ? bf16_trunc(x) : f16_trunc(x);
                    std::memcpy(dst, &h, 2);
                }
            }
    }

    std::vector<AdamTensor> tensors() {
        std::vector<AdamTensor> ts;
        for (size_t k = 0; k < lengths.size(); ++k)
            ts.push_back({param[k].data(), grad[k].data(), m[k].data(), v[k].data(),
                          copy[k].empty() ? nullptr : copy[k].data(),
                          stale ? stale_out[k].data() : nullptr, lengths[k], &hypers[k % 3]});
        return ts;
    }

    uint64_t step(int threads) {
        const auto ts = tensors();
        const uint64_t bad =
            zb::opt::adam_step(AdamBatch{gtype, ctype, ts.data(), ts.size()}, threads);
        for (auto &h : hypers)
            ++h.step;
        return bad;
    }
};

// Equal bits, except that any two NaNs are equal (payloads are not part of the contract).
bool same(float a, float b) {
    return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
}

void assert_same(const Problem &a, const Problem &b) {
    for (size_t k = 0; k < a.lengths.size(); ++k)
        for (size_t i = 0; i < a.lengths[k]; ++i) {
            if (!same(a.param[k][i], b.param[k][i]) || !same(a.m[k][i], b.m[k][i]) ||
                !same(a.v[k][i], b.v[k][i]))
                fail_msg("tensor %zu element %zu: param %a vs %a, m %a vs %a, v %a vs %a", k, i,
                         static_cast<double>(a.param[k][i]), static_cast<double>(b.param[k][i]),
                         static_cast<double>(a.m[k][i]), static_cast<double>(b.m[k][i]),
                         static_cast<double>(a.v[k][i]), static_cast<double>(b.v[k][i]));
            if (!a.copy[k].empty() && a.copy[k][i] != b.copy[k][i])
                fail_msg("tensor %zu element %zu: copy %#x vs %#x", k, i, a.copy[k][i],
                         b.copy[k][i]);
            for (const Problem *x : {&a, &b})
                if (x->stale && bits(x->stale_out[k][i]) != bits(x->param[k][i]))
                    fail_msg("tensor %zu element %zu: stale differs from param", k, i);
        }
}

// Small lengths in every configuration, two steps, with plain and (where there is a copy-out or a
// snapshot) streaming stores; three threads start slices between W-element boundaries, so the
// streaming path's head runs too (130: two AVX-512 iterations and a tail of 2, so
// every path's vector body runs in every configuration); the long tensor (slices ending inside it,
// vector bodies and tails) in five of the configurations and one step, which keeps the test well
// under 30 s with ASan.
void test_bit_identical(void **) {
    const zb::opt::Prefetch prefetch = zb::opt::requested_prefetch();
    for (GradType g : {GradType::f32, GradType::bf16, GradType::f16})
        for (CopyType c : {CopyType::none, CopyType::bf16, CopyType::f16})
            for (bool stale : {false, true}) {
                const bool big = stale && (static_cast<int>(g) + static_cast<int>(c)) % 2 == 0;
                std::vector<size_t> lengths{0, 1, 7, 15, 17, 3, 33, 130};
                if (big) lengths.insert(lengths.begin() + 5, 1000003);
                const int steps = big ? 1 : 2;
                rng_state = 42;
                Problem start(lengths, g, c, stale);
                start.hypers[1].step = 3;
                Problem ref = start;
                use(Isa::scalar);
                std::vector<std::vector<Buf<unsigned char>>> grads;
                for (int s = 0; s < steps; ++s) {
                    grads.push_back(ref.grad);
                    ref.step(1);
                    ref.new_grads();
                }
                for (Isa isa : isas())
                    for (int threads : {1, 2, 3})
                        for (Stores stores : {Stores::cached, Stores::streaming}) {
                            if (isa == Isa::scalar && threads == 1 && stores == Stores::cached)
                                continue;
                            if (stores == Stores::streaming && c == CopyType::none && !stale)
                                continue; // nothing to stream
                            use(isa);
                            zb::opt::force_stores(stores);
                            // Prefetching into L1, L2 or not at all: the same bits.
                            zb::opt::force_prefetch(threads == 1   ? zb::opt::Prefetch::l1
                                                    : threads == 2 ? zb::opt::Prefetch::l2
                                                                   : zb::opt::Prefetch::off);
                            Problem p = start;
                            for (int s = 0; s < steps; ++s) {
                                p.grad = grads[static_cast<size_t>(s)];
                                p.step(threads);
                            }
                            assert_same(ref, p);
                        }
            }
    use(zb::opt::best_isa());
    zb::opt::force_stores(Stores::automatic);
    zb::opt::force_prefetch(prefetch);
}

// A torch.optim.Adam/AdamW step in double over the same inputs.
struct Ref {
    double p, m, v;
};

Ref reference(Ref r, double g, const AdamHyper &h) {
    g *= h.grad_scale;
    if (h.adamw)
        r.p *= 1.0 - static_cast<double>(h.lr) * h.weight_decay;
    else
        g += static_cast<double>(h.weight_decay) * r.p;
    r.m = h.beta1 * r.m + (1.0 - h.beta1) * g;
    r.v = h.beta2 * r.v + (1.0 - h.beta2) * g * g;
    double bias1 = 1.0, bias2 = 1.0;
    if (h.bias_correction) {
        bias1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
        bias2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
    }
    const double denom = std::sqrt(r.v) / std::sqrt(bias2) + h.eps;
    r.p -= h.lr / bias1 * r.m / denom;
    return r;
}

double grad_value(const Problem &p, size_t k, size_t i) {
    const unsigned char *src = p.grad[k].data() + i * grad_size(p.gtype);
    if (p.gtype == GradType::f32) {
        float f;
        std::memcpy(&f, src, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, src, 2);
    return p.gtype == GradType::bf16 ? bf16_value(h) : f16_value(h);
}

// The copy-out holds the representable value nearest to the param, ties to even.
void assert_nearest(uint16_t c, float p, CopyType t) {
    auto value = [t](uint16_t h) { return t == CopyType::bf16 ? bf16_value(h) : f16_value(h); };
    const double err = std::fabs(value(c) - p);
    for (int d : {-1, 1}) {
        const uint16_t n = static_cast<uint16_t>(c + d);
        if ((n & 0x7fff) == 0x7fff || ((c & 0x7fff) == 0 && d < 0)) continue;
        const double e = std::fabs(value(n) - p);
        if (e < err || (e == err && (c & 1)))
            fail_msg("copy %#x of %a is not the nearest-even (neighbour %#x)", c,
                     static_cast<double>(p), n);
    }
}

// Tolerance: relative 2^-17 (about 8 float ulps, 5 steps of a few roundings each) plus an absolute
// 1e-9 for values near zero.
void assert_close(double got, double want, const char *what, size_t i) {
    if (std::fabs(got - want) > std::fabs(want) * 0x1p-17 + 1e-9)
        fail_msg("%s[%zu] = %.9g, reference %.9g", what, i, got, want);
}

void test_double_reference(void **) {
    use(Isa::scalar);
    for (GradType g : {GradType::f32, GradType::bf16, GradType::f16})
        for (CopyType c : {CopyType::bf16, CopyType::f16}) {
            rng_state = 7;
            Problem p({4099, 1000, 517}, g, c, true);
            std::vector<std::vector<Ref>> ref(p.lengths.size());
            for (size_t k = 0; k < p.lengths.size(); ++k)
                for (size_t i = 0; i < p.lengths[k]; ++i)
                    ref[k].push_back({p.param[k][i], p.m[k][i], p.v[k][i]});
            for (int s = 0; s < 5; ++s) {
                for (size_t k = 0; k < p.lengths.size(); ++k)
                    for (size_t i = 0; i < p.lengths[k]; ++i)
                        ref[k][i] = reference(ref[k][i], grad_value(p, k, i), p.hypers[k % 3]);
                assert_int_equal(p.step(2), 0);
                p.new_grads();
            }
            for (size_t k = 0; k < p.lengths.size(); ++k)
                for (size_t i = 0; i < p.lengths[k]; ++i) {
                    assert_close(p.param[k][i], ref[k][i].p, "param", i);
                    assert_close(p.m[k][i], ref[k][i].m, "exp_avg", i);
                    assert_close(p.v[k][i], ref[k][i].v, "exp_avg_sq", i);
                    assert_nearest(p.copy[k][i], p.param[k][i], c);
                    assert_int_equal(bits(p.stale_out[k][i]), bits(p.param[k][i]));
                }
        }
    use(zb::opt::best_isa());
}

void put_grad(Problem &p, size_t i, uint32_t f32, uint16_t half) {
    unsigned char *dst = p.grad[0].data() + i * grad_size(p.gtype);
    if (p.gtype == GradType::f32)
        std::memcpy(dst, &f32, 4);
    else
        std::memcpy(dst, &half, 2);
}

void test_nonfinite_counted(void **) {
    for (GradType g : {GradType::f32, GradType::bf16, GradType::f16}) {
        rng_state = 3;
        Problem start({1001}, g, CopyType::bf16, false);
        start.hypers[0].grad_scale = 2.0f;
        const bool f16 = g == GradType::f16;
        put_grad(start, 3, 0x7f800000, f16 ? 0x7c00 : 0x7f80);    // +inf
        put_grad(start, 500, 0xff800000, f16 ? 0xfc00 : 0xff80);  // -inf
        put_grad(start, 1000, 0x7fc00001, f16 ? 0x7e01 : 0x7fc1); // NaN
        // Finite until scaled: overflows only after grad_scale (fp16 cannot hold such values).
        put_grad(start, 10, bits(2e38f), f16 ? 0x3c00 : bf16_trunc(2e38f));
        const uint64_t want = f16 ? 3 : 4;
        Problem ref = start;
        use(Isa::scalar);
        assert_int_equal(ref.step(1), want);
        assert_true(std::isnan(ref.param[0][3]));
        for (Isa isa : isas())
            for (int threads : {1, 2, 3}) {
                use(isa);
                Problem p = start;
                assert_int_equal(p.step(threads), want);
                assert_same(ref, p);
            }
    }
    use(zb::opt::best_isa());
}

// A NaN param stays a NaN in the copy-out, whatever its payload: rounding 0x7fffffff to bf16 as a
// number would carry into the sign and give -0.
void test_nan_copy_out(void **) {
    const uint32_t nans[] = {0x7fffffff, 0xffffffff, 0x7f800001, 0x7fc00000, 0xff80ffff};
    const size_t n = 5 * 27; // vector bodies and tails on every path (W is 32 or 64)
    for (CopyType c : {CopyType::bf16, CopyType::f16})
        for (Isa isa : isas()) {
            use(isa);
            rng_state = 13;
            Problem p({n}, GradType::f32, c, false);
            for (size_t i = 0; i < n; ++i)
                std::memcpy(&p.param[0][i], &nans[i % 5], 4);
            p.step(1);
            for (size_t i = 0; i < n; ++i) {
                const uint16_t h = p.copy[0][i];
                const bool nan = c == CopyType::bf16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f)
                                                     : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
                if (!nan)
                    fail_msg("%s copy-out of NaN %#x is %#x", zb::opt::isa_name(isa), nans[i % 5],
                             h);
            }
        }
    use(zb::opt::best_isa());
}

// Scaling by a power of two is exact, so grad_scale = 1/4 on g must equal scale 1 on g/4.
void test_grad_scale(void **) {
    for (Isa isa : isas()) {
        use(isa);
        rng_state = 11;
        Problem a({777}, GradType::f32, CopyType::none, false);
        Problem b = a;
        a.hypers[0].grad_scale = 0.25f;
        for (size_t i = 0; i < 777; ++i) {
            float x;
            std::memcpy(&x, b.grad[0].data() + 4 * i, 4);
            x *= 0.25f;
            std::memcpy(b.grad[0].data() + 4 * i, &x, 4);
        }
        a.step(2);
        b.step(2);
        assert_same(a, b);
        // And it is not a no-op.
        Problem c = b;
        c.hypers[0].grad_scale = 0.5f;
        c.hypers[0].step = 1;
        Problem d = b;
        d.hypers[0].step = 1;
        c.step(1);
        d.step(1);
        assert_true(bits(c.param[0][1]) != bits(d.param[0][1]));
    }
    use(zb::opt::best_isa());
}

// Threads of an existing team each take a slice; their counts add up to adam_step's.
void test_in_team(void **) {
    rng_state = 5;
    Problem start({5, 100003, 64}, GradType::bf16, CopyType::f16, true);
    put_grad(start, 2, 0, 0x7f80);
    Problem ref = start;
    use(Isa::scalar);
    assert_int_equal(ref.step(1), 1);
    use(zb::opt::best_isa());
    Problem p = start;
    const auto ts = p.tensors();
    const AdamBatch batch{p.gtype, p.ctype, ts.data(), ts.size()};
    uint64_t bad = 0;
    zb::opt::TeamShare share;
#pragma omp parallel num_threads(3) reduction(+ : bad)
    bad += zb::opt::adam_step_in_team(batch, share);
    assert_int_equal(bad, 1);
    assert_same(ref, p);
}

// Automatic prefetching: made from kCalibrationPairs pairs of large steps (one without
// prefetching and one into L2 each; small steps, and steps whose threads' slices are small, do
// not count), then the faster of off and l2 for the process; the results are the bits of steps
// without prefetching throughout.
void test_prefetch_chosen_at_run_time(void **) {
    using zb::opt::Prefetch;
    const Prefetch before = zb::opt::requested_prefetch();
    zb::opt::force_prefetch(Prefetch::automatic);
    assert_int_equal(static_cast<int>(zb::opt::requested_prefetch()),
                     static_cast<int>(Prefetch::automatic));
    // (no test before this one steps a large problem in automatic mode)
    assert_int_equal(static_cast<int>(zb::opt::chosen_prefetch()),
                     static_cast<int>(Prefetch::automatic));
    rng_state = 11;
    Problem start({size_t{80} * zb::opt::TeamShare::kChunk}, GradType::f32, CopyType::none, false);
    Problem small_start({size_t{4} * zb::opt::TeamShare::kChunk}, GradType::f32, CopyType::none,
                        false);
    Problem ref = start, small_ref = small_start;
    Problem p = start, small = small_start;
    // Timed: large calls whose threads' slices have 16 chunks or more (each thread's own, so
    // that the first one has enough to time); the others run without prefetching. (Checked here
    // rather than by a step of five threads or more: LLVM's OpenMP runtime leaks the growth of
    // its pool at exit, which LeakSanitizer reports.)
    const auto chunks = [](size_t n) {
        return zb::opt::Kind{n * zb::opt::TeamShare::kChunk, GradType::f32, CopyType::none, false,
                             1};
    };
    assert_true(zb::opt::timed_kind(chunks(64), 1));
    assert_false(zb::opt::timed_kind(chunks(63), 1));
    assert_true(zb::opt::timed_kind(chunks(80), 5));
    assert_false(zb::opt::timed_kind(chunks(80), 6));
    assert_false(zb::opt::timed_kind(chunks(64), 5));
    // At least 2 * kCalibrationPairs large steps; more where a pair was broken (a step too slow
    // to time whole, on a loaded machine), within 8 times as many
    int steps = 0;
    while (zb::opt::chosen_prefetch() == Prefetch::automatic &&
           steps < 8 * zb::opt::kCalibrationPairs) {
        p.step(1);
        small.step(1);
        ++steps;
    }
    assert_true(steps >= 2 * zb::opt::kCalibrationPairs);
    const Prefetch chosen = zb::opt::chosen_prefetch();
    assert_true(chosen == Prefetch::off || chosen == Prefetch::l2);
    assert_int_equal(static_cast<int>(zb::opt::active_prefetch()), static_cast<int>(chosen));
    zb::opt::force_prefetch(Prefetch::off);
    for (int s = 0; s < steps; ++s) {
        ref.step(1);
        small_ref.step(1);
    }
    assert_same(ref, p);
    assert_same(small_ref, small);
    zb::opt::force_prefetch(before);
}

void test_slices_and_isa(void **) {
    for (size_t total : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1000003}})
        for (int threads = 1; threads <= 5; ++threads) {
            size_t next = 0;
            for (int t = 0; t < threads; ++t) {
                size_t lo, hi;
                zb::opt::adam_slice(total, t, threads, lo, hi);
                assert_int_equal(lo, next);
                assert_true(hi >= lo && (hi % 16 == 0 || hi == total));
                next = hi;
            }
            assert_int_equal(next, total);
        }
    assert_string_equal(zb::opt::isa_name(Isa::scalar), "scalar");
    assert_string_equal(zb::opt::isa_name(Isa::avx2), "avx2");
    assert_string_equal(zb::opt::isa_name(Isa::avx512), "avx512");
    assert_string_equal(zb::opt::isa_name(Isa::neon), "neon");
    assert_string_equal(zb::opt::isa_name(Isa::sve), "sve");
    // The dispatcher's reading of the CPU agrees with the kernel's view of it, so the cross-ISA
    // tests below cover every kernel this CPU can run.
    assert_int_equal(static_cast<int>(zb::opt::best_isa()), static_cast<int>(expected_best()));
    // An ISA this build or CPU lacks (another architecture's among them) is refused, and the one
    // in use stays.
    use(Isa::scalar);
    for (Isa isa : {Isa::avx2, Isa::avx512, Isa::neon, Isa::sve}) {
        const bool here = std::find(isas().begin(), isas().end(), isa) != isas().end();
        assert_int_equal(zb::opt::isa_supported(isa), here);
        if (!here) {
            assert_false(zb::opt::force_isa(isa));
            assert_int_equal(static_cast<int>(zb::opt::active_isa()),
                             static_cast<int>(Isa::scalar));
        }
    }
    use(zb::opt::best_isa());
    assert_int_equal(static_cast<int>(zb::opt::active_isa()),
                     static_cast<int>(zb::opt::best_isa()));
}

// Each vector path's streaming instantiations, called directly (so they surely run) with fp32 and
// bf16 gradients, from an element off the W boundary (its head), to the end and to a point inside:
// the same bits as plain stores, and nothing written outside [lo, hi).
void test_streaming_kernels(void **) {
    using zb::opt::detail::RangeKernel;
    const std::array<size_t, 2> kBounds[] = {{5, 1000}, {37, 700}, {64, 197}};
    for (Isa isa : isas()) {
        if (isa == Isa::scalar) continue;
        const RangeKernel kernel = kernel_of(isa);
        for (GradType g : {GradType::f32, GradType::bf16})
            for (CopyType c : {CopyType::bf16, CopyType::f16})
                for (const std::array<size_t, 2> &bounds : kBounds) {
                    rng_state = 21;
                    Problem plain({1000}, g, c, true);
                    Problem streamed = plain;
                    zb::opt::detail::Consts k = zb::opt::detail::make_consts(plain.hypers[0]);
                    const AdamTensor a = plain.tensors()[0], b = streamed.tensors()[0];
                    k.stream_out = false;
                    const uint64_t bad_a = kernel(a, k, g, c, bounds[0], bounds[1]);
                    k.stream_out = true;
                    assert_true(zb::opt::detail::streams_out(b, k, c));
                    const uint64_t bad_b = kernel(b, k, g, c, bounds[0], bounds[1]);
                    assert_int_equal(bad_a, bad_b);
                    for (size_t i = 0; i < 1000; ++i)
                        if (bits(plain.param[0][i]) != bits(streamed.param[0][i]) ||
                            bits(plain.m[0][i]) != bits(streamed.m[0][i]) ||
                            bits(plain.v[0][i]) != bits(streamed.v[0][i]) ||
                            plain.copy[0][i] != streamed.copy[0][i] ||
                            bits(plain.stale_out[0][i]) != bits(streamed.stale_out[0][i]))
                            fail_msg("%s element %zu: streaming differs from plain stores",
                                     zb::opt::isa_name(isa), i);
                    for (size_t i = 0; i < 1000; ++i)
                        if ((i < bounds[0] || i >= bounds[1]) &&
                            (streamed.copy[0][i] != 0 || bits(streamed.stale_out[0][i]) != 0))
                            fail_msg("%s wrote element %zu outside [%zu, %zu)",
                                     zb::opt::isa_name(isa), i, bounds[0], bounds[1]);
                }
    }
}

// Streaming stores are used when asked for and possible (aligned streams, something to write), and
// automatic mode asks for them exactly above the last-level cache.
void test_streaming_choice(void **) {
    using zb::opt::detail::streams_out;
    Problem p({64}, GradType::f32, CopyType::bf16, true);
    AdamTensor t = p.tensors()[0];
    zb::opt::detail::Consts c{};
    assert_false(streams_out(t, c, CopyType::bf16));
    c.stream_out = true;
    assert_true(streams_out(t, c, CopyType::bf16));
    AdamTensor off = t;
    off.copy_out = static_cast<uint16_t *>(t.copy_out) + 1;
    assert_false(streams_out(off, c, CopyType::bf16));
    off = t;
    off.stale = t.stale + 4;
    assert_false(streams_out(off, c, CopyType::bf16));
    off = t;
    off.stale = nullptr;
    assert_true(streams_out(off, c, CopyType::bf16));
    assert_false(streams_out(off, c, CopyType::none));
    off.stale = t.stale;
    off.copy_out = static_cast<uint16_t *>(t.copy_out) + 1;
    assert_true(streams_out(off, c, CopyType::none)); // a copy-out not written is not looked at

    const size_t llc = zb::opt::last_level_cache();
    assert_true(llc >= 64 * 1024);
    zb::opt::force_stores(Stores::automatic);
    assert_int_equal(static_cast<int>(zb::opt::stores_for(llc)), static_cast<int>(Stores::cached));
    assert_int_equal(static_cast<int>(zb::opt::stores_for(llc + 1)),
                     static_cast<int>(Stores::streaming));
    zb::opt::force_stores(Stores::cached);
    assert_int_equal(static_cast<int>(zb::opt::stores_for(llc * 4)),
                     static_cast<int>(Stores::cached));
    zb::opt::force_stores(Stores::streaming);
    assert_int_equal(static_cast<int>(zb::opt::stores_for(1)), static_cast<int>(Stores::streaming));
    // A batch streams only what it writes, and never on the scalar path.
    const AdamTensor one = t;
    const auto batch_stores = [&](CopyType copy, const AdamTensor *tensor) {
        return static_cast<int>(zb::opt::batch_stores(AdamBatch{GradType::f32, copy, tensor, 1}));
    };
    assert_int_equal(batch_stores(CopyType::bf16, &one), static_cast<int>(Stores::streaming));
    use(Isa::scalar);
    assert_int_equal(batch_stores(CopyType::bf16, &one), static_cast<int>(Stores::cached));
    use(zb::opt::best_isa());
    off = t;
    off.stale = nullptr;
    assert_int_equal(batch_stores(CopyType::none, &off), static_cast<int>(Stores::cached));
    zb::opt::force_stores(Stores::automatic);
    assert_int_equal(batch_stores(CopyType::bf16, &one), static_cast<int>(Stores::cached));
}

// One number for every result of every kernel configuration, the same on every ISA and every
// architecture: FNV-1a over the params, moments, copy-outs, snapshots and non-finite counts of
// three steps over tensors with tails, special gradients (infinities, a NaN, subnormals, the
// largest finite values) and every grad, copy-out and snapshot type, Adam and AdamW. A NaN counts
// as one value whatever its payload (a NaN an operation makes is positive on Arm, negative on
// x86-64). tests/unit/adam_digest_cross.sh compares the digests of two builds.
struct Digest {
    uint64_t h = 0xcbf29ce484222325ull;
    void add(const void *p, size_t n) {
        for (size_t i = 0; i < n; ++i)
            h = (h ^ static_cast<const unsigned char *>(p)[i]) * 0x100000001b3ull;
    }
    void add_float(float f) {
        const uint32_t u = std::isnan(f) ? 0x7fc00000u : bits(f);
        add(&u, 4);
    }
    void add_half(uint16_t c, CopyType t) { // a NaN code: exponent all ones, fraction not zero
        const bool nan = t == CopyType::bf16 ? (c & 0x7f80) == 0x7f80 && (c & 0x7f)
                                             : (c & 0x7c00) == 0x7c00 && (c & 0x3ff);
        const uint16_t v = nan ? 0x7fff : c;
        add(&v, 2);
    }
};

uint64_t kernel_digest() {
    Digest d;
    for (GradType g : {GradType::f32, GradType::bf16, GradType::f16})
        for (CopyType c : {CopyType::none, CopyType::bf16, CopyType::f16})
            for (bool stale : {false, true}) {
                rng_state = 7;
                Problem p({1, 7, 33, 130, 1003, 64}, g, c, stale);
                for (int s = 0; s < 3; ++s) {
                    // Special gradients in the last tensor: +-inf, NaN, subnormal, largest finite.
                    const size_t gs = grad_size(g);
                    unsigned char *last = p.grad.back().data();
                    const uint32_t f32[] = {0x7f800000, 0xff800000, 0x7fc00001,
                                            0x00000003, 0x7f7fffff, 0x80400000};
                    const uint16_t b16[] = {0x7f80, 0xff80, 0x7fc1, 0x0003, 0x7f7f, 0x8040};
                    const uint16_t h16[] = {0x7c00, 0xfc00, 0x7e01, 0x0003, 0x7bff, 0x8200};
                    for (size_t k = 0; k < 6; ++k) {
                        const void *src = g == GradType::f32 ? static_cast<const void *>(&f32[k])
                                          : g == GradType::bf16
                                              ? static_cast<const void *>(&b16[k])
                                              : static_cast<const void *>(&h16[k]);
                        std::memcpy(last + (k * 11 + static_cast<size_t>(s)) * gs, src, gs);
                    }
                    const uint64_t bad = p.step(2);
                    d.add(&bad, sizeof bad);
                    p.new_grads();
                }
                for (size_t k = 0; k < p.lengths.size(); ++k)
                    for (size_t i = 0; i < p.lengths[k]; ++i) {
                        d.add_float(p.param[k][i]);
                        d.add_float(p.m[k][i]);
                        d.add_float(p.v[k][i]);
                        if (c != CopyType::none) d.add_half(p.copy[k][i], c);
                        if (stale) d.add_float(p.stale_out[k][i]);
                    }
            }
    return d.h;
}

// The digests of every ISA this CPU runs must agree (the cross-ISA tests compare the same results
// element by element; this checks the digest itself).
void test_digest_same_on_every_isa(void **) {
    uint64_t first = 0;
    for (Isa isa : isas()) {
        use(isa);
        const uint64_t h = kernel_digest();
        if (isa == Isa::scalar) first = h;
        if (h != first)
            fail_msg("%s digest %016llx, scalar %016llx", zb::opt::isa_name(isa),
                     static_cast<unsigned long long>(h), static_cast<unsigned long long>(first));
    }
    use(zb::opt::best_isa());
}

} // namespace

int main(int argc, char **argv) {
    if (argc == 2 && std::strcmp(argv[1], "--digest") == 0) { // "ISA DIGEST" per ISA
        for (Isa isa : isas()) {
            use(isa);
            std::printf("%s %016llx\n", zb::opt::isa_name(isa),
                        static_cast<unsigned long long>(kernel_digest()));
        }
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_same_on_every_isa),
        cmocka_unit_test(test_slices_and_isa),
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_double_reference),
        cmocka_unit_test(test_nonfinite_counted),
        cmocka_unit_test(test_grad_scale),
        cmocka_unit_test(test_in_team),
        cmocka_unit_test(test_nan_copy_out),
        cmocka_unit_test(test_streaming_choice),
        cmocka_unit_test(test_streaming_kernels),
        cmocka_unit_test(test_prefetch_chosen_at_run_time),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
