// zenflow-demo: a ZenFlow-style training loop in C++, the example for C/C++ trainers of how to
// drive the optimizer worker through its C API (zb_worker_* in <zenbind/worker.h>). Python
// trainers use zenflow_bind.optim.AdamW instead (contrib/demo/train_gpt.py).
//
// The training process does real compute on its training cores (OpenMP, OMP_NUM_THREADS
// threads): a dense "forward/backward" (matrix products) and the gradients of a least-squares
// loss, written into one of two gradient buffers in shared memory. Its optimizer worker meanwhile
// runs the Adam step on the previous step's gradients (double-buffered, overlapped), and hands
// back bf16 parameters, as a GPU rank would upload them. Run under `srun --zenflow-bind` the two
// sides get disjoint cores; without it they share every core of the task. scripts/demo.sh ends
// with one run of it:
//     srun -n1 -c2 --zenflow-bind build/default/contrib/demo/zenflow-demo --params 4194304
#include <zenbind/worker.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#include <sched.h>
#include <string>
#include <vector>

namespace {

struct Args {
    size_t params = size_t(8) << 20;
    unsigned steps = 20;
    unsigned passes = 24; // matrix products per step: the trainer's compute per step
    bool json = false;
};

constexpr int kMatrix = 192;
constexpr int kWaitMs = 30000; // a step never takes this long here: a dead worker ends the run

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "zenflow-demo: %s: %s\n", what, zb_last_error());
    std::exit(1);
}

int usage(const char *message) {
    std::fprintf(stderr,
                 "zenflow-demo: %s\nusage: zenflow-demo [--params N] [--steps K] [--passes P] "
                 "[--json]\n",
                 message);
    return 2;
}

bool parse_args(int argc, char **argv, Args &a) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--json") {
            a.json = true;
            continue;
        }
        if (i + 1 >= argc) return usage(("missing value after " + arg).c_str()), false;
        char *end = nullptr;
        const unsigned long long v = std::strtoull(argv[++i], &end, 10);
        if (*end || v == 0 || v > (1ull << 32))
            return usage(("bad value for " + arg).c_str()), false;
        if (arg == "--params")
            a.params = v;
        else if (arg == "--steps")
            a.steps = static_cast<unsigned>(v);
        else if (arg == "--passes")
            a.passes = static_cast<unsigned>(v);
        else
            return usage(("unknown argument " + arg).c_str()), false;
    }
    return true;
}

float bf16_to_float(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Deterministic targets in [-1, 1): the "data" the model fits.
float target(size_t i) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return static_cast<float>(x & 0xFFFFFF) / float(1 << 23) - 1.0f;
}

// The compute-bound part of a training step: dense products on the training threads.
double forward_backward(std::vector<float> &a, const std::vector<float> &b, unsigned passes) {
    std::vector<float> c(size_t(kMatrix) * kMatrix);
    for (unsigned p = 0; p < passes; ++p) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < kMatrix; ++i) {
            float *ci = &c[size_t(i) * kMatrix];
            std::fill(ci, ci + kMatrix, 0.0f);
            for (int k = 0; k < kMatrix; ++k) {
                const float aik = a[size_t(i) * kMatrix + k];
                const float *bk = &b[size_t(k) * kMatrix];
                for (int j = 0; j < kMatrix; ++j)
                    ci[j] += aik * bk[j];
            }
        }
        // Normalise so the next pass stays finite; feeds the result forward like a layer.
        float peak = 1e-30f;
        for (float v : c)
            peak = std::max(peak, std::fabs(v));
        for (size_t n = 0; n < c.size(); ++n)
            a[n] = c[n] / peak;
    }
    return a[0];
}

// Gradients of loss = mean((w - t)^2) at the trainer's (bf16) weights; returns the loss.
double gradients(const std::vector<uint16_t> &weights, float *grad, size_t n) {
    double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss)
    for (size_t i = 0; i < n; ++i) {
        const float d = bf16_to_float(weights[i]) - target(i);
        grad[i] = 2.0f * d;
        loss += double(d) * d;
    }
    return loss / double(n);
}

std::string cpulist_of_self() {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    std::string out;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        int last = cpu;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
            ++last;
        if (!out.empty()) out += ','; // not `"," + to_string()`: GCC 12's false -Wrestrict at -O3
        out += std::to_string(cpu);
        if (last > cpu) {
            out += '-';
            out += std::to_string(last);
        }
        cpu = last;
    }
    return out;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, a)) return 2;

    zb_worker_t *worker = nullptr;
    if (zb_worker_spawn(nullptr, 0, &worker) != ZB_OK) die("cannot start the optimizer worker");
    zb_group_attr group{};
    group.numel = a.params;
    group.grad = ZB_DTYPE_FP32;
    group.copy_out = ZB_DTYPE_BF16;
    zb_adam_hyper_init(&group.hyper);
    group.hyper.lr = 1e-2f;
    group.hyper.weight_decay = 0.0f;
    unsigned id = 0;
    zb_group_buffers buf{};
    if (zb_worker_group_add(worker, &group, &id) != ZB_OK ||
        zb_worker_group_buffers(worker, id, &buf) != ZB_OK)
        die("cannot register the parameters");

    // The trainer's copy of the weights in bf16, as on a GPU; the master copy is fp32 in shm.
    std::vector<uint16_t> weights(a.params, 0);
    std::vector<float> ma(size_t(kMatrix) * kMatrix, 0.5f), mb(size_t(kMatrix) * kMatrix, 0.25f);

    std::vector<double> step_ms, wait_ms, compute_ms, opt_ms;
    double loss_first = 0, loss_last = 0;
    bool in_flight = false;
    const auto run0 = Clock::now();
    for (unsigned s = 1; s <= a.steps; ++s) {
        const auto t0 = Clock::now();
        const unsigned k = s % 2; // fill buffer k while the worker reads buffer 1-k
        forward_backward(ma, mb, a.passes);
        const double loss = gradients(weights, static_cast<float *>(buf.grads[k]), a.params);
        compute_ms.push_back(ms_since(t0));
        if (s == 1) loss_first = loss;
        loss_last = loss;

        const auto w0 = Clock::now();
        zb_worker_result result{};
        if (in_flight && zb_worker_wait_result(worker, kWaitMs, &result) != ZB_OK)
            die("optimizer step failed");
        wait_ms.push_back(ms_since(w0));
        if (in_flight) { // "upload" the updated weights, as after a GPU rank's H2D copy
            std::memcpy(weights.data(), buf.copy_out, a.params * sizeof(uint16_t));
            opt_ms.push_back(result.seconds * 1e3); // the worker's own time for the step
        }

        zb_worker_step step{};
        step.step = s;
        step.grad_scale = 1.0f;
        step.grad_buffer = k;
        if (zb_worker_submit(worker, &step) != ZB_OK) die("cannot submit a step");
        in_flight = true;
        step_ms.push_back(ms_since(t0));
    }
    if (zb_worker_wait_result(worker, kWaitMs, nullptr) != ZB_OK) die("optimizer step failed");
    const double total_s = ms_since(run0) / 1e3;

    unsigned nthreads = 0;
    std::string opt_cpus;
    zb_worker_threads(worker, &nthreads);
    for (unsigned t = 0; t < nthreads; ++t) {
        pid_t tid;
        int cpu = -1;
        if (zb_worker_thread(worker, t, &tid, &cpu) == ZB_OK) {
            if (!opt_cpus.empty()) opt_cpus += ',';
            opt_cpus += std::to_string(cpu);
        }
    }
    zb_worker_memory mem{};
    zb_worker_memory_usage(worker, &mem);
    zb_worker_destroy(worker);

    const char *task = std::getenv("SLURM_PROCID");
    const std::string train_cpus = cpulist_of_self();
    if (a.json) {
        std::printf("{\"task\": %s, \"train_cpus\": \"%s\", \"train_threads\": %d, "
                    "\"opt_cpus\": \"%s\", \"opt_threads\": %u, \"steps\": %u, "
                    "\"step_ms\": %.2f, \"compute_ms\": %.2f, \"wait_ms\": %.2f, \"opt_ms\": %.2f, "
                    "\"total_s\": %.3f, \"loss_first\": %.6f, \"loss_last\": %.6f, "
                    "\"bytes_per_param\": %.2f}\n",
                    task ? task : "0", train_cpus.c_str(), omp_get_max_threads(), opt_cpus.c_str(),
                    nthreads, a.steps, median(step_ms), median(compute_ms), median(wait_ms),
                    median(opt_ms), total_s, loss_first, loss_last, mem.bytes_per_param);
    } else {
        std::printf("task %s: training CPUs %s (%d threads), optimizer CPUs %s (%u threads)\n"
                    "  step %.2f ms (compute %.2f ms, waiting for the optimizer %.2f ms, "
                    "optimizer step %.2f ms), loss %.4f -> %.4f over %u steps\n",
                    task ? task : "0", train_cpus.c_str(), omp_get_max_threads(), opt_cpus.c_str(),
                    nthreads, median(step_ms), median(compute_ms), median(wait_ms), median(opt_ms),
                    loss_first, loss_last, a.steps);
    }
    return loss_last < loss_first ? 0 : 1;
}
