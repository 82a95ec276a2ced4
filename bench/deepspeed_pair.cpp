// DeepSpeed's cpu_adam step and zenflow's fp32 AdamW step in one process, alternated step by step
// on two sets of buffers with the same values, the order swapped every pair (A B, B A, ...), so
// that both see the same machine at the same moment: on a machine whose memory speed drifts from
// one second to the next, the ratio of two separate processes measures the drift as much as the
// code. Built by deepspeed_pair.sh against DeepSpeed's own sources (never part of this repository),
// with DeepSpeed's build flags; both steps run on the same pinned OpenMP team (OMP_PROC_BIND=close
// OMP_PLACES=cores, which the script sets).
//
// Prints per-step medians of both, the median and the spread of the per-pair ratios, and the
// largest difference between the two results (both are AdamW; they round differently, so not
// bit-equal).
#include <map>               // before DeepSpeed's code, which uses it without including it
#include <torch/extension.h> // the DeepSpeed harness's stand-in: c10 scalar types only

#include "cpu_adam.h"
#include "measure.hpp"     // now, median, untouched: as zenflow-bench times and allocates
#include <zbadam/adam.hpp> // zenflow's kernels (libzbadam)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <omp.h>
#include <string>
#include <unordered_map>
#include <vector>

// DeepSpeed's Step_1/4/8, create_adam_optimizer and step_invoker, cut from cpu_adam_impl.cpp by the
// harness's extract.sh.
#include "ds_step_kernels.inc"

namespace {

constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kWd = 1e-2f;

using zb::bench::median;
using zb::bench::now;
using zb::bench::untouched;

// One side's buffers, first touched by the stepping threads.
struct State {
    zb::bench::Buffer<float> p, g, m, v;
    explicit State(size_t n)
        : p(untouched<float>(n, "deepspeed_pair")), g(untouched<float>(n, "deepspeed_pair")),
          m(untouched<float>(n, "deepspeed_pair")), v(untouched<float>(n, "deepspeed_pair")) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; ++i) {
            p[i] = float(int(i % 2001) - 1000) * 1e-3f;
            g[i] = float(int(i % 17) - 8) * 1e-3f;
            m[i] = v[i] = 0.0f;
        }
    }
};

} // namespace

int main(int argc, char **argv) {
    const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 0,
              steps = argc > 3 ? std::atoi(argv[3]) : 30;
    const std::string isa = argc > 4 ? argv[4] : "";
    const bool isa_ok = isa.empty() || (isa == "avx2" && zb::opt::force_isa(zb::opt::Isa::avx2)) ||
                        (isa == "avx512" && zb::opt::force_isa(zb::opt::Isa::avx512));
    if (n < 1024 || threads < 1 || steps < 4 || !isa_ok) {
        std::fprintf(stderr, "usage: deepspeed_pair ELEMENTS THREADS [STEPS>=4 [avx2|avx512]]\n"
                             "(an ISA this CPU has)\n");
        return 2;
    }
    omp_set_dynamic(0);
    omp_set_num_threads(threads);
    State ds(n), zf(n);

    create_adam_optimizer(0, kLr, kBeta1, kBeta2, kEps, kWd, true, false);
    auto opt = std::static_pointer_cast<Adam_Optimizer>(s_optimizers[0]);
    const auto invoke = invokers.at(std::tuple(c10::ScalarType::Float, c10::ScalarType::Float));
    zb::opt::AdamHyper hyper;
    hyper.lr = kLr, hyper.beta1 = kBeta1, hyper.beta2 = kBeta2, hyper.eps = kEps;
    hyper.weight_decay = kWd, hyper.adamw = true;
    const zb::opt::AdamTensor tensor{.param = zf.p.get(),
                                     .grad = zf.g.get(),
                                     .exp_avg = zf.m.get(),
                                     .exp_avg_sq = zf.v.get(),
                                     .n = n,
                                     .hyper = &hyper};
    const zb::opt::AdamBatch batch{zb::opt::GradType::f32, zb::opt::CopyType::none, &tensor, 1};

    auto ds_step = [&](int step) {
        const double t0 = now();
        opt->IncrementStep(size_t(step), kBeta1, kBeta2);
        opt->update_state(kLr, kEps, kWd, true);
        invoke(opt, ds.p.get(), ds.g.get(), ds.m.get(), ds.v.get(), n, true);
        return now() - t0;
    };
    auto zf_step = [&](int step) {
        const double t0 = now();
        hyper.step = step;
        zb::opt::adam_step(batch, threads);
        return now() - t0;
    };
    std::vector<double> tds, tzf, ratio;
    const int warmup = 2;
    for (int s = 1; s <= warmup + steps; ++s) {
        double a, b;
        if (s % 2) {
            a = ds_step(s);
            b = zf_step(s);
        } else {
            b = zf_step(s);
            a = ds_step(s);
        }
        if (s <= warmup) continue;
        tds.push_back(a), tzf.push_back(b), ratio.push_back(a / b);
    }
    double diff = 0; // largest difference of the parameters, relative to their size
    for (size_t i = 0; i < n; ++i)
        if (const double d =
                double(std::fabs(ds.p[i] - zf.p[i])) / std::max(1e-3, double(std::fabs(ds.p[i])));
            !(d <= diff)) // a NaN on either side counts as the largest difference
            diff = d;
    std::printf("{\"elements\":%zu,\"threads\":%d,\"steps\":%d,\"isa\":\"%s\","
                "\"deepspeed_gelem_per_s\":%.4f,\"zenflow_gelem_per_s\":%.4f,"
                "\"zenflow_over_deepspeed\":%.4f,\"pair_ratio_min\":%.4f,\"pair_ratio_max\":%.4f,"
                "\"max_rel_diff\":%.3g}\n",
                n, threads, steps, zb::opt::isa_name(zb::opt::active_isa()),
                double(n) / median(tds) / 1e9, double(n) / median(tzf) / 1e9, median(ratio),
                *std::min_element(ratio.begin(), ratio.end()),
                *std::max_element(ratio.begin(), ratio.end()), diff);
    return diff < 1e-4 ? 0 : 1;
}
