// zb_adam_step: the worker's step (the gradient pre-pass when asked, then the fused kernel) run by
// the caller's own threads, in a region of its own or the caller's OpenMP team; zb_adam_grad_stats:
// the pre-pass alone.
#include "error.hpp"
#include "hyper_check.hpp"
#include "omp_team.hpp"

#include <zenbind/adam.h>

#include <zbadam/adam.hpp>
#include <zbadam/float_mode.hpp>
#include <zbadam/grad_stats.hpp>
#include <zbadam/team_share.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <omp.h>

namespace {

using zb::fail;
namespace opt = zb::opt;

int raw(const zb_dtype &field) {
    int v;
    std::memcpy(&v, &field, sizeof v);
    return v;
}

// What both calls take of args (grad, grad_scale, threads) and the tensors' gradients.
void check_common(const zb_adam_tensor *tensors, size_t count, const zb_adam_args *a,
                  const char *name) {
    const std::string fn = std::string(name) + ": ";
    if (!a) fail(ZB_EINVAL, fn + "args is NULL");
    zb::check_size(a->size, sizeof *a, name, "args", "zb_adam_args_init");
    if (count && !tensors) fail(ZB_EINVAL, fn + "tensors is NULL");
    const int grad = raw(a->grad);
    if (grad != ZB_DTYPE_FP32 && grad != ZB_DTYPE_BF16 && grad != ZB_DTYPE_FP16)
        fail(ZB_EINVAL, fn + "grad must be FP32, BF16 or FP16");
    if (!std::isfinite(a->grad_scale)) fail(ZB_EINVAL, fn + "grad_scale must be finite");
    if (a->threads < ZB_ADAM_TEAM || a->threads > ZB_ADAM_MAX_THREADS)
        fail(ZB_EINVAL, fn + "threads must be 1 to " + std::to_string(ZB_ADAM_MAX_THREADS) +
                            ", 0 (OpenMP's default) or ZB_ADAM_TEAM, not " +
                            std::to_string(a->threads));
    if (a->threads == ZB_ADAM_TEAM && omp_get_level() == 0)
        fail(ZB_EINVAL, fn + "threads is ZB_ADAM_TEAM outside an OpenMP parallel region (of "
                             "libzenbind's OpenMP runtime: a caller built with another one, "
                             "clang's libomp with libzenbind's libgomp say, is in none here)");
    // No buffer holds more fp32 elements than this, nor may their sum wrap.
    constexpr size_t most = static_cast<size_t>(PTRDIFF_MAX) / sizeof(float);
    size_t total = 0;
    for (size_t k = 0; k < count; ++k) {
        const std::string which = fn + "tensor " + std::to_string(k);
        if (tensors[k].numel && !tensors[k].grad)
            fail(ZB_EINVAL, which + ": grad must not be NULL");
        if (tensors[k].numel > most - total)
            fail(ZB_EINVAL, which + ": numel " + std::to_string(tensors[k].numel) +
                                (tensors[k].numel > most ? " is more than a buffer can hold"
                                                         : " brings the tensors' total past what "
                                                           "buffers can hold"));
        total += tensors[k].numel;
    }
}

// Everything a refused call is refused for, before anything is allocated or written. Pure, so
// every thread of a team that calls with the same arguments comes to the same answer.
void check(const zb_adam_tensor *tensors, size_t count, const zb_adam_args *a) {
    const std::string fn = "zb_adam_step: ";
    check_common(tensors, count, a, "zb_adam_step");
    const int copy = raw(a->copy_out);
    if (copy != ZB_DTYPE_NONE && copy != ZB_DTYPE_BF16 && copy != ZB_DTYPE_FP16)
        fail(ZB_EINVAL, fn + "copy_out must be NONE, BF16 or FP16");
    if (a->step < 1) fail(ZB_EINVAL, fn + "step must be >= 1 (the number of this step)");
    if (a->flags & ~(ZB_STEP_SKIP_NONFINITE | ZB_STEP_GRAD_NORM))
        fail(ZB_EINVAL, fn + "unknown flags");
    if (!std::isfinite(a->max_grad_norm) || a->max_grad_norm < 0)
        fail(ZB_EINVAL, fn + "max_grad_norm must be finite and >= 0");
    zb::check_hyper(a->hyper, fn + "args->hyper");
    for (size_t k = 0; k < count; ++k) {
        const zb_adam_tensor &t = tensors[k];
        const std::string which = fn + "tensor " + std::to_string(k);
        if (t.hyper) zb::check_hyper(*t.hyper, which + ": hyper");
        if (t.step < 0) fail(ZB_EINVAL, which + ": step must be >= 1, or 0 for args->step");
        if (!t.numel) continue;
        if (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)
            fail(ZB_EINVAL, which + ": param, grad, exp_avg and exp_avg_sq must not be NULL");
        if ((copy != ZB_DTYPE_NONE) != (t.copy_out != nullptr))
            fail(ZB_EINVAL, which + (copy != ZB_DTYPE_NONE ? ": copy_out is NULL"
                                                           : ": copy_out given, but its dtype "
                                                             "is NONE"));
    }
}

opt::GradType grad_type(zb_dtype d) {
    return d == ZB_DTYPE_BF16   ? opt::GradType::bf16
           : d == ZB_DTYPE_FP16 ? opt::GradType::f16
                                : opt::GradType::f32;
}

opt::CopyType copy_type(zb_dtype d) {
    return d == ZB_DTYPE_BF16   ? opt::CopyType::bf16
           : d == ZB_DTYPE_FP16 ? opt::CopyType::f16
                                : opt::CopyType::none;
}

// One step, shared by the threads that run it; with only_stats, its pre-pass alone.
struct Step {
    std::vector<opt::AdamHyper> hypers; // one per tensor
    std::vector<opt::AdamTensor> tensors;
    opt::AdamBatch batch;
    std::vector<size_t> first_block; // per tensor, into blocks
    std::vector<opt::GradStats> blocks;
    bool stats = false, skip = false, only_stats = false;
    unsigned flags = 0;
    float max_grad_norm = 0, grad_scale = 1;
    opt::GradStats found;
    std::atomic<uint64_t> nonfinite{0};
    opt::TeamShare share;

    Step(const zb_adam_tensor *in, size_t count, const zb_adam_args &a, bool stats_alone)
        : only_stats(stats_alone) {
        hypers.resize(count);
        tensors.resize(count);
        first_block.resize(count);
        size_t nblocks = 0;
        for (size_t k = 0; k < count; ++k) {
            // (the pre-pass alone reads only grad and numel of a tensor)
            const zb_adam_hyper &h = in[k].hyper && !only_stats ? *in[k].hyper : a.hyper;
            hypers[k] = opt::AdamHyper{h.lr,
                                       h.beta1,
                                       h.beta2,
                                       h.eps,
                                       h.weight_decay,
                                       h.adamw != 0,
                                       h.bias_correction != 0,
                                       in[k].step ? in[k].step : a.step,
                                       a.grad_scale};
            tensors[k] =
                opt::AdamTensor{in[k].param,    in[k].grad, in[k].exp_avg, in[k].exp_avg_sq,
                                in[k].copy_out, nullptr,    in[k].numel,   &hypers[k]};
            first_block[k] = nblocks;
            nblocks += opt::grad_stats_blocks(in[k].numel);
        }
        batch = opt::AdamBatch{grad_type(a.grad),
                               only_stats ? opt::CopyType::none : copy_type(a.copy_out),
                               tensors.data(), count};
        flags = a.flags;
        max_grad_norm = a.max_grad_norm;
        grad_scale = a.grad_scale;
        stats = only_stats || (flags & (ZB_STEP_SKIP_NONFINITE | ZB_STEP_GRAD_NORM)) ||
                max_grad_norm > 0;
        if (stats) blocks.resize(nblocks);
    }

    // This thread's blocks of the pre-pass.
    void grad_stats(int me, int threads) {
        size_t lo, hi;
        opt::grad_stats_share(blocks.size(), me, threads, lo, hi);
        for (size_t k = 0; k < tensors.size(); ++k) {
            const opt::AdamTensor &t = tensors[k];
            const size_t first = first_block[k], end = first + opt::grad_stats_blocks(t.n);
            for (size_t b = lo > first ? lo : first; b < hi && b < end; ++b) {
                const size_t from = (b - first) * opt::kGradStatsBlock;
                const size_t to =
                    from + opt::kGradStatsBlock < t.n ? from + opt::kGradStatsBlock : t.n;
                blocks[b] = opt::grad_block_stats(t.grad, batch.grad, from, to, grad_scale);
            }
        }
    }

    // One thread, after the pre-pass: skip, or fold the clip coefficient into every scale.
    void decide() {
        found = opt::grad_stats_sum(blocks.data(), blocks.size());
        skip = (flags & ZB_STEP_SKIP_NONFINITE) && found.nonfinite > 0;
        if (skip || !(max_grad_norm > 0)) return;
        const float coefficient = opt::clip_coefficient(max_grad_norm, found.sum_squares);
        for (opt::AdamHyper &h : hypers)
            h.grad_scale = grad_scale * coefficient;
    }

    // Every thread of the team that runs the step; barriers between the phases.
    void run() {
        const opt::IeeeMode mode; // every thread alike, whatever the caller's threads hold
        const int me = omp_get_thread_num(), threads = omp_get_num_threads();
        if (stats) {
            grad_stats(me, threads);
#pragma omp barrier
#pragma omp masked
            decide();
#pragma omp barrier
        }
        if (!skip && !only_stats)
            nonfinite.fetch_add(opt::adam_step_in_team(batch, share), std::memory_order_relaxed);
#pragma omp barrier
    }

    zb_grad_stats grad_stats() const {
        return zb_grad_stats{found.sum_squares, found.nonfinite};
    }

    zb_worker_result result(double seconds) const {
        zb_worker_result r{};
        r.nonfinite = stats ? found.nonfinite : nonfinite.load(std::memory_order_relaxed);
        r.grad_norm = stats ? std::sqrt(found.sum_squares) : 0.0;
        r.skipped = skip ? 1 : 0;
        r.seconds = seconds;
        return r;
    }
};

double since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ZB_ADAM_TEAM: every thread of the caller's team is here with the same arguments, already
// checked. One of them makes the step and hands it to the others; the last barrier of run() is
// passed before it is freed.
zb_status run_in_callers_team(const zb_adam_tensor *tensors, size_t count, const zb_adam_args &a,
                              zb_worker_result *out, zb_grad_stats *stats_out) {
    const auto start = std::chrono::steady_clock::now();
    Step *step = nullptr;
#pragma omp single copyprivate(step)
    {
        try {
            step = new Step(tensors, count, a, stats_out != nullptr);
        } catch (...) {
            step = nullptr;
        }
    }
    if (!step) {
        zb::set_last_error(stats_out ? "zb_adam_grad_stats: out of memory"
                                     : "zb_adam_step: out of memory");
        return ZB_ENOMEM;
    }
    step->run();
    const zb_worker_result r = step->result(since(start));
    const zb_grad_stats found = step->grad_stats();
#pragma omp barrier
#pragma omp single
    delete step;
    // The threads may share one out: one writer at a time.
#pragma omp critical(zb_adam_out)
    {
        if (out) *out = r;
        if (stats_out) *stats_out = found;
    }
    return ZB_OK;
}

int team_size(const zb_adam_args &a) {
    return zb::team_threads(a.threads > 0 ? a.threads
                                          : std::min(omp_get_max_threads(), ZB_ADAM_MAX_THREADS));
}

// Either call in a parallel region of its own (threads > 0 or 0) or the caller's team.
zb_status run(const zb_adam_tensor *tensors, size_t count, const zb_adam_args &a,
              zb_worker_result *out, zb_grad_stats *stats_out) {
    if (a.threads == ZB_ADAM_TEAM) return run_in_callers_team(tensors, count, a, out, stats_out);
    return zb::guard([&] {
        const auto start = std::chrono::steady_clock::now();
        std::unique_ptr<Step> step;
        try {
            step = std::make_unique<Step>(tensors, count, a, stats_out != nullptr);
        } catch (const std::bad_alloc &) {
            fail(ZB_ENOMEM, std::string(stats_out ? "zb_adam_grad_stats" : "zb_adam_step") +
                                ": out of memory for the step's bookkeeping");
        }
        const int threads = team_size(a);
#pragma omp parallel num_threads(threads)
        step->run();
        if (out) *out = step->result(since(start));
        if (stats_out) *stats_out = step->grad_stats();
    });
}

} // namespace

extern "C" void zb_adam_args_init_size(zb_adam_args *args, size_t size) {
    if (!zb::init_sized(args, size)) return;
    args->grad = ZB_DTYPE_FP32;
    args->copy_out = ZB_DTYPE_NONE;
    zb_adam_hyper_init(&args->hyper);
    args->step = 1;
    args->grad_scale = 1.0f;
}

extern "C" zb_status zb_adam_step(const zb_adam_tensor *tensors, size_t count,
                                  const zb_adam_args *args, zb_worker_result *result) {
    const zb_status status = zb::guard([&] { check(tensors, count, args); });
    if (status != ZB_OK) return status;
    return run(tensors, count, *args, result, nullptr);
}

extern "C" zb_status zb_adam_grad_stats(const zb_adam_tensor *tensors, size_t count,
                                        const zb_adam_args *args, zb_grad_stats *out) {
    const zb_status status = zb::guard([&] {
        check_common(tensors, count, args, "zb_adam_grad_stats");
        if (!out) fail(ZB_EINVAL, "zb_adam_grad_stats: out is NULL");
    });
    if (status != ZB_OK) return status;
    return run(tensors, count, *args, nullptr, out);
}
