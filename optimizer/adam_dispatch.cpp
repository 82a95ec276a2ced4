// The public entry points: per-tensor constants, thread slices over the concatenated elements, and
// the choice of kernel at run time (one binary for every node of an architecture).
#include "adam_kernels.hpp"
#include "cpu_level.hpp"
#include "prefetch_choice.hpp"
#include <zbadam/team_share.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <omp.h>

namespace zb::opt {
namespace {

// The widest kernel this CPU runs (isa_supported(): what each needs). On aarch64 SVE is taken only
// where its vectors are wider than NEON's 128 bits (A64FX 512, Graviton 3 256): at 128 bits
// (Neoverse V2, Grace) the two move the same bytes per instruction and NEON's loop carries no
// predicates. A choice from the instruction sets, not a measurement: no Arm machine was at hand
// (force_isa() and zenflow-bench --isa compare them on one).
Isa detect() {
    for (Isa isa : {Isa::avx512, Isa::avx2})
        if (isa_supported(isa)) return isa;
#if defined(__aarch64__)
    if (isa_supported(Isa::sve) && detail::sve_bytes() > 16) return Isa::sve;
#endif
    return isa_supported(Isa::neon) ? Isa::neon : Isa::scalar;
}

std::atomic<Isa> &forced() {
    static std::atomic<Isa> isa{best_isa()};
    return isa;
}

std::atomic<Stores> &stores() {
    static std::atomic<Stores> mode{Stores::automatic};
    return mode;
}

// The largest cache of cpu0 that sysfs lists (index0, index1, ... up to the last level), in bytes.
size_t read_last_level_cache() {
    size_t best = 0;
    for (int index = 0; index < 8; ++index) {
        char path[96];
        std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        FILE *f = std::fopen(path, "re");
        if (!f) break;
        unsigned long long value = 0;
        char unit = 0;
        const int got = std::fscanf(f, "%llu%c", &value, &unit);
        std::fclose(f);
        if (got < 1) continue;
        const size_t bytes = static_cast<size_t>(value) * (unit == 'K'   ? 1024
                                                           : unit == 'M' ? 1 << 20
                                                                         : 1);
        if (bytes > best) best = bytes;
    }
    return best ? best : size_t{32} << 20;
}

detail::RangeKernel kernel_for(Isa isa) {
    switch (isa) {
#if defined(__x86_64__)
    case Isa::avx512:
        return detail::range_avx512;
    case Isa::avx2:
        return detail::range_avx2;
#elif defined(__aarch64__)
    case Isa::sve:
        return detail::range_sve;
    case Isa::neon:
        return detail::range_neon;
#endif
    default:
        return detail::range_scalar;
    }
}

} // namespace

namespace detail {

Consts make_consts(const AdamHyper &h) {
    const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay;
    double bias1 = 1.0, bias2 = 1.0;
    if (h.bias_correction) {
        bias1 = 1.0 - std::pow(b1, static_cast<double>(h.step));
        bias2 = 1.0 - std::pow(b2, static_cast<double>(h.step));
    }
    Consts c{};
    c.grad_scale = h.grad_scale;
    c.adamw = h.adamw;
    c.decay = h.adamw ? static_cast<float>(1.0 - lr * wd) : 1.0f;
    c.l2 = h.adamw ? 0.0f : h.weight_decay;
    c.beta1 = h.beta1;
    c.one_minus_beta1 = static_cast<float>(1.0 - b1);
    c.beta2 = h.beta2;
    c.one_minus_beta2 = static_cast<float>(1.0 - b2);
    c.neg_step_size = static_cast<float>(-lr / bias1);
    c.inv_bias2_sqrt = static_cast<float>(1.0 / std::sqrt(bias2));
    c.eps = h.eps;
    return c;
}

} // namespace detail

void adam_slice(size_t total, int thread, int threads, size_t &lo, size_t &hi) {
    const size_t chunks = (total + 15) / 16, t = static_cast<size_t>(thread);
    const size_t n = threads > 0 ? static_cast<size_t>(threads) : 1;
    lo = chunks * t / n * 16;
    hi = chunks * (t + 1) / n * 16;
    if (lo > total) lo = total;
    if (hi > total) hi = total;
}

namespace {

// Updates elements [lo, hi) of the concatenation of the batch's tensors.
uint64_t run_chunk(const AdamBatch &batch, detail::RangeKernel kernel, bool stream,
                   Prefetch prefetching, size_t lo, size_t hi) {
    uint64_t bad = 0;
    const AdamHyper *last = nullptr;
    bool have = false;
    detail::Consts c{};
    size_t base = 0;
    for (size_t k = 0; k < batch.count && base < hi; ++k) {
        const AdamTensor &t = batch.tensors[k];
        const size_t end = base + t.n;
        if (end > lo) {
            if (!have || t.hyper != last) {
                static const AdamHyper defaults{};
                c = detail::make_consts(t.hyper ? *t.hyper : defaults);
                c.stream_out = stream;
                c.prefetch = prefetching;
                last = t.hyper;
                have = true;
            }
            const size_t a = lo > base ? lo - base : 0, b = (hi < end ? hi : end) - base;
            bad += kernel(t, c, batch.grad, batch.copy, a, b);
        }
        base = end;
    }
    return bad;
}

} // namespace

uint64_t adam_step_in_team(const AdamBatch &batch, TeamShare &share) {
    Kind kind{0, batch.grad, batch.copy, false, batch.count};
    for (size_t k = 0; k < batch.count; ++k) {
        kind.total += batch.tensors[k].n;
        kind.stale = kind.stale || batch.tensors[k].stale;
    }
    const size_t total = kind.total;
    const detail::RangeKernel kernel = kernel_for(active_isa());
    const bool stream = batch_stores(batch) == Stores::streaming;
    const int me = omp_get_thread_num(), threads = omp_get_num_threads();
    uint64_t call;
    const Prefetch prefetching = call_prefetch(kind, threads, call);
    size_t lo, hi;
    if (!TeamShare::fits(total, threads)) {
        adam_slice(total, me, threads, lo, hi);
        return run_chunk(batch, kernel, stream, prefetching, lo, hi);
    }
    uint64_t bad = 0;
    share.begin(total, me, threads);
    // The first thread of a timed call times its chunks after its first (the streams' first
    // pages and lines: up to 2.5x slower) while the run-time choice is being made.
    const bool timed = me == 0 && call != UINT64_MAX;
    size_t claimed = 0, elements = 0;
    std::chrono::steady_clock::time_point start;
    while (share.claim(me, lo, hi)) {
        if (timed && claimed++ == 1) start = std::chrono::steady_clock::now();
        if (claimed > 1) elements += hi - lo;
        bad += run_chunk(batch, kernel, stream, prefetching, lo, hi);
    }
    if (timed)
        record_call(
            kind, call, claimed > 8 ? elements : 0,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return bad;
}

uint64_t adam_step(const AdamBatch &batch, int threads) {
    uint64_t bad = 0;
    const int n = threads > 0 ? threads : omp_get_max_threads();
    TeamShare share;
#pragma omp parallel num_threads(n) reduction(+ : bad)
    bad += adam_step_in_team(batch, share);
    return bad;
}

Isa best_isa() {
    static const Isa isa = detect();
    return isa;
}

Isa active_isa() {
    return forced().load(std::memory_order_relaxed);
}

// The AVX-512 kernel needs AVX-512F, FMA and F16C, the AVX2 one AVX2, FMA and F16C: x86-64 levels
// 4 and 3 hold them (one CPU test for the kernels and the gradient pre-pass alike).
bool isa_supported(Isa isa) {
    switch (isa) {
    case Isa::scalar:
        return true;
#if defined(__x86_64__)
    case Isa::avx2:
        return x86_level() >= 3;
    case Isa::avx512:
        return x86_level() >= 4;
#elif defined(__aarch64__)
    case Isa::neon:
        return arm_neon();
    case Isa::sve:
        return arm_sve();
#endif
    default:
        return false;
    }
}

bool force_isa(Isa isa) {
    if (!isa_supported(isa)) return false;
    forced().store(isa, std::memory_order_relaxed);
    return true;
}

void force_stores(Stores s) {
    stores().store(s, std::memory_order_relaxed);
}

size_t last_level_cache() {
    static const size_t bytes = read_last_level_cache();
    return bytes;
}

Stores stores_for(size_t bytes) {
    const Stores s = stores().load(std::memory_order_relaxed);
    if (s != Stores::automatic) return s;
    return bytes > last_level_cache() ? Stores::streaming : Stores::cached;
}

Stores batch_stores(const AdamBatch &batch) {
    size_t total = 0;
    bool stale = false;
    for (size_t k = 0; k < batch.count; ++k) {
        total += batch.tensors[k].n;
        stale = stale || batch.tensors[k].stale;
    }
    if (active_isa() == Isa::scalar || (batch.copy == CopyType::none && !stale))
        return Stores::cached;
    // Every stream once: what the step leaves in the caches (a snapshot counted for every tensor
    // when some have one).
    const size_t bytes_per_element = 12 + (batch.grad == GradType::f32 ? 4 : 2) +
                                     (batch.copy == CopyType::none ? 0 : 2) + (stale ? 4 : 0);
    return stores_for(total * bytes_per_element);
}

const char *stores_name(Stores s) {
    switch (s) {
    case Stores::automatic:
        return "auto";
    case Stores::cached:
        return "cached";
    case Stores::streaming:
        return "streaming";
    }
    return "unknown";
}

const char *isa_name(Isa isa) {
    switch (isa) {
    case Isa::avx512:
        return "avx512";
    case Isa::avx2:
        return "avx2";
    case Isa::neon:
        return "neon";
    case Isa::sve:
        return "sve";
    case Isa::scalar:
        return "scalar";
    }
    return "unknown";
}

} // namespace zb::opt
