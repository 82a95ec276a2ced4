// zenflow-bench worker: one Adam step through the worker (submit to done) against the same kernel
// run in this process on the same CPUs and threads, alternated in one run so that both see the
// same machine noise; what the gradient pre-pass costs (steps that skip non-finite gradients, and
// that clip by the global norm, against plain worker steps in the same rotation); and the bytes
// per parameter the worker configuration really takes, from the RSS of both processes.
#include <zbadam/adam.hpp>
#include <zbadam/adam_convert.hpp>
#include <zbutil/proc_status.hpp>

#include <zenbind/worker.h>

#include "affinity.hpp"
#include "args.hpp"
#include "measure.hpp"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <omp.h>

#include <sched.h>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "zenflow-bench worker: %s: %s\n", what, zb_last_error());
    std::exit(1);
}

// Memory of both processes, shared pages counted once: the worker's whole RSS (it touches every
// shared buffer of the group) plus the trainer's private (anonymous) pages.
size_t both_rss(pid_t worker) {
    using zb::util::proc_status_bytes;
    return proc_status_bytes(worker, "VmRSS") + proc_status_bytes(0, "RssAnon");
}

using zb::bench::median;
using zb::bench::untouched;

void fill(void *grad, zb_dtype type, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        const float g = (float(x >> 8) / float(1u << 24) - 0.5f) * 1e-2f;
        uint32_t u;
        std::memcpy(&u, &g, 4);
        if (type == ZB_DTYPE_FP32)
            static_cast<float *>(grad)[i] = g;
        else if (type == ZB_DTYPE_BF16)
            static_cast<uint16_t *>(grad)[i] = static_cast<uint16_t>(u >> 16);
        else
            static_cast<uint16_t *>(grad)[i] = zb::opt::detail::float_to_f16(g);
    }
}

// A JSON list of ratios, in order.
std::string json_list(const std::vector<double> &v) {
    std::string out = "[";
    for (const double x : v) {
        char one[32];
        std::snprintf(one, sizeof one, "%s%.4f", out.size() > 1 ? ", " : "", x);
        out += one;
    }
    return out + "]";
}

// The group in this process: the same kernel, on buffers that start on a page as the worker's do.
struct InProcess {
    size_t n, gsize;
    zb::opt::GradType gt;
    zb::opt::CopyType ct;
    zb::bench::Buffer<float> param, m, v, snapshot;
    zb::bench::Buffer<uint16_t> copied;
    zb::bench::Buffer<char> grads;
    zb::opt::AdamHyper hyper;
    zb::opt::AdamTensor tensor;
    int64_t step = 0;

    InProcess(size_t count, zb_dtype grad, zb_dtype copy, bool stale, const char *who)
        : n(count), gsize(grad == ZB_DTYPE_FP32 ? 4 : 2),
          gt(grad == ZB_DTYPE_FP32   ? zb::opt::GradType::f32
             : grad == ZB_DTYPE_BF16 ? zb::opt::GradType::bf16
                                     : zb::opt::GradType::f16),
          ct(copy == ZB_DTYPE_BF16   ? zb::opt::CopyType::bf16
             : copy == ZB_DTYPE_FP16 ? zb::opt::CopyType::f16
                                     : zb::opt::CopyType::none),
          param(untouched<float>(n, who)), m(untouched<float>(n, who)), v(untouched<float>(n, who)),
          snapshot(untouched<float>(stale ? n : 0, who)),
          copied(untouched<uint16_t>(copy != ZB_DTYPE_NONE ? n : 0, who)),
          grads(untouched<char>(2 * n * gsize, who)), tensor{.param = param.get(),
                                                             .exp_avg = m.get(),
                                                             .exp_avg_sq = v.get(),
                                                             .copy_out = copied.get(),
                                                             .stale = snapshot.get(),
                                                             .n = n,
                                                             .hyper = &hyper} {
        std::fill_n(param.get(), n, 0.1f);
        std::fill_n(m.get(), n, 0.0f);
        std::fill_n(v.get(), n, 0.0f);
        fill(grads.get(), grad, n, 1);
        fill(grads.get() + n * gsize, grad, n, 2);
        hyper.weight_decay = 1e-2f;
    }
    InProcess(const InProcess &) = delete;

    // One step on `threads` threads; returns its seconds.
    double run(int threads) {
        hyper.step = ++step;
        tensor.grad = grads.get() + size_t(step & 1) * n * gsize;
        const zb::opt::AdamBatch batch{gt, ct, &tensor, 1};
        const double t0 = zb::bench::now();
        zb::opt::adam_step(batch, threads);
        return zb::bench::now() - t0;
    }
};

} // namespace

int bench_worker(int argc, char **argv) {
    using zb::bench::parse_count;
    size_t n = 0;
    zb_dtype grad = ZB_DTYPE_FP32, copy = ZB_DTYPE_NONE;
    int threads = 0, iterations = 7, stale = 0;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        unsigned long long v = 0;
        if (a == "--json") {
            json = true;
        } else if (a == "--stale") {
            stale = 1;
        } else if (i + 1 >= argc) {
            return zb::bench::bad_usage("worker", "unknown option or missing value: '%s'", argv[i]);
        } else if (a == "--elements") {
            if (!parse_count(argv[++i], 1ull << 40, v))
                return zb::bench::bad_usage(
                    "worker", "--elements wants an integer in [1, 2^40], not '%s'", argv[i]);
            n = static_cast<size_t>(v);
        } else if (a == "--threads") {
            if (!parse_count(argv[++i], 4096, v))
                return zb::bench::bad_usage(
                    "worker", "--threads wants an integer in [1, 4096], not '%s'", argv[i]);
            threads = static_cast<int>(v);
        } else if (a == "--iterations") {
            if (!parse_count(argv[++i], 1000000, v))
                return zb::bench::bad_usage(
                    "worker", "--iterations wants an integer in [1, 1000000], not '%s'", argv[i]);
            iterations = static_cast<int>(v);
        } else if (a == "--copy-out") {
            const std::string c = argv[++i];
            copy = c == "bf16" ? ZB_DTYPE_BF16 : c == "fp16" ? ZB_DTYPE_FP16 : ZB_DTYPE_NONE;
            if (copy == ZB_DTYPE_NONE)
                return zb::bench::bad_usage("worker", "--copy-out wants bf16 or fp16, not '%s'",
                                            argv[i]);
        } else if (a == "--grad") {
            const std::string g = argv[++i];
            grad = g == "fp32"   ? ZB_DTYPE_FP32
                   : g == "bf16" ? ZB_DTYPE_BF16
                   : g == "fp16" ? ZB_DTYPE_FP16
                                 : ZB_DTYPE_NONE;
            if (grad == ZB_DTYPE_NONE)
                return zb::bench::bad_usage("worker", "--grad wants fp32, bf16 or fp16, not '%s'",
                                            argv[i]);
        } else {
            return zb::bench::bad_usage("worker", "unknown option: '%s'", argv[i]);
        }
    }
    if (n == 0) return zb::bench::bad_usage("worker", "--elements N is required");
    const zb::bench::Machine machine;
    Affinity affinity;
    if (!read_affinity(affinity)) {
        std::perror("zenflow-bench: sched_getaffinity");
        return 1;
    }
    const std::vector<int> &cpus = affinity.cpus;
    if (threads > static_cast<int>(cpus.size()))
        return zb::bench::bad_usage("worker", "--threads %d but only %zu CPUs in the affinity",
                                    threads, cpus.size());
    if (threads <= 0) threads = static_cast<int>(cpus.size());
    std::string list;
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, falsely) on `"," + to_string(x)`.
    for (int t = 0; t < threads; ++t) {
        if (t) list += ',';
        list += std::to_string(cpus[size_t(t) % cpus.size()]);
    }

    // Two in-process copies, one allocated before the worker's group and one after it: on a KVM
    // guest the same step on the copy allocated first took 0.93-1.12x the time it took on the
    // other, depending on the run, and the allocation order alone moved the worker's ratio from
    // 1.00-1.10 to 0.90-0.98. The worker step is held to the mean of the two.
    const char *who = "zenflow-bench worker";
    InProcess before(n, grad, copy, stale != 0, who);

    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.cpus = list.c_str(); // read by zb_worker_spawn() only
    attr.threads = static_cast<unsigned>(threads);
    zb_worker_t *w = nullptr;
    if (zb_worker_spawn(&attr, 0, &w) != ZB_OK) die("spawn");
    pid_t pid;
    zb_worker_pid(w, &pid);
    const size_t base_rss = both_rss(pid);

    zb_group_attr g{};
    g.numel = n;
    g.grad = grad;
    g.copy_out = copy;
    g.stale = stale;
    zb_adam_hyper_init(&g.hyper);
    unsigned id;
    if (zb_worker_group_add(w, &g, &id) != ZB_OK) die("group_add");
    zb_group_buffers b;
    zb_worker_group_buffers(w, id, &b);
    for (size_t i = 0; i < n; ++i)
        b.params[i] = 0.1f;
    fill(b.grads[0], grad, n, 1);
    fill(b.grads[1], grad, n, 2);
    int64_t step = 0;
    // The gradients are finite: the skipping steps pay for the check and still update.
    double own = 0; // the worker's own time for the last step (result.seconds)
    auto worker_step = [&](unsigned flags = 0, float max_grad_norm = 0.0f) {
        const zb_worker_step s{++step, 1.0f, unsigned(step & 1), nullptr, 0, flags, max_grad_norm};
        zb_worker_result result;
        const double t0 = zb::bench::now();
        if (zb_worker_submit(w, &s) != ZB_OK || zb_worker_wait_result(w, 600000, &result) != ZB_OK)
            die("step");
        own = result.seconds;
        return zb::bench::now() - t0;
    };
    worker_step(); // both gradient buffers read once: every shared page is now resident
    worker_step();
    const size_t first_rss = both_rss(pid);
    zb_worker_memory mem;
    zb_worker_memory_usage(w, &mem);

    InProcess after(n, grad, copy, stale != 0, who);
#pragma omp parallel num_threads(threads)
    {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[size_t(omp_get_thread_num()) % cpus.size()], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    // The in-process step: both copies, in an order swapped every call; returns their mean.
    int local_calls = 0;
    auto local = [&] {
        InProcess &first = local_calls % 2 ? after : before,
                  &second = local_calls % 2 ? before : after;
        ++local_calls;
        const double a = first.run(threads);
        return (a + second.run(threads)) / 2;
    };
    local();
    local();
    // Each iteration times a worker step and an in-process one, in an order swapped every
    // iteration (so neither always follows the other's buffers through the caches), then the two
    // checked worker steps. Every ratio is the median of the iterations' own ratios: the machine's
    // speed drifts within a second, and both steps of an iteration see the same drift.
    std::vector<double> tw, town, tl, tskip, tclip, overhead, skip_over, clip_over;
    for (int i = 0; i < iterations; ++i) {
        if (i % 2) tl.push_back(local());
        tw.push_back(worker_step());
        town.push_back(own);
        if (i % 2 == 0) tl.push_back(local());
        tskip.push_back(worker_step(ZB_STEP_SKIP_NONFINITE));
        tclip.push_back(worker_step(ZB_STEP_SKIP_NONFINITE | ZB_STEP_GRAD_NORM, 1.0f));
        overhead.push_back(tw.back() / tl.back());
        skip_over.push_back(tskip.back() / tw.back());
        clip_over.push_back(tclip.back() / tw.back());
    }
    sched_setaffinity(0, sizeof affinity.mask, &affinity.mask);
    const size_t end_worker_rss = zb::util::proc_status_bytes(pid, "VmRSS");
    zb_worker_memory end;
    zb_worker_memory_usage(w, &end);
    zb_worker_destroy(w);

    const double ratio = median(overhead);
    const double skip_ratio = median(skip_over), clip_ratio = median(clip_over);
    const double bpp = double(first_rss - base_rss) / double(n);
    const char *gname = grad == ZB_DTYPE_FP32 ? "fp32" : grad == ZB_DTYPE_BF16 ? "bf16" : "fp16";
    const char *cname = copy == ZB_DTYPE_NONE ? "none" : copy == ZB_DTYPE_BF16 ? "bf16" : "fp16";
    const long growth = long(end_worker_rss) - long(mem.worker_rss);
    const char *wait_policy = std::getenv("OMP_WAIT_POLICY");
    if (!wait_policy)
        wait_policy = "default";
    else if (std::strspn(wait_policy, "ACEIPSTVacdeiptsv") != std::strlen(wait_policy))
        wait_policy = "other"; // not one libgomp knows, nor safe to print in JSON
    if (json) {
        std::printf("{\"elements\": %zu, \"grad\": \"%s\", \"copy\": \"%s\", \"stale\": %s, "
                    "\"threads\": %d, \"isa\": \"%s\", \"omp_wait_policy\": \"%s\", "
                    "\"iterations\": %d, \"worker_step_s\": %.6f, \"worker_own_step_s\": %.6f, "
                    "\"inprocess_step_s\": %.6f, "
                    "\"overhead_ratio\": %.4f, \"overhead_ratios\": %s, "
                    "\"bytes_per_param\": %.3f, "
                    "\"bytes_per_param_layout\": %.3f, \"worker_rss\": %zu, "
                    "\"trainer_rss_anon\": %zu, \"worker_rss_growth\": %ld, "
                    "\"skip_step_s\": %.6f, \"skip_ratio\": %.4f, \"skip_ratios\": %s, "
                    "\"clip_step_s\": %.6f, \"clip_ratio\": %.4f, \"clip_ratios\": %s, %s}\n",
                    n, gname, cname, stale ? "true" : "false", threads,
                    zb::opt::isa_name(zb::opt::active_isa()), wait_policy, iterations, median(tw),
                    median(town), median(tl), ratio, json_list(overhead).c_str(), bpp,
                    mem.bytes_per_param, mem.worker_rss, mem.trainer_rss_anon, growth,
                    median(tskip), skip_ratio, json_list(skip_over).c_str(), median(tclip),
                    clip_ratio, json_list(clip_over).c_str(), machine.json().c_str());
    } else {
        std::printf("Adam step, %zu elements, %s gradients, copy-out %s, stale %s, %d threads on "
                    "CPUs %s, ISA %s, OMP_WAIT_POLICY %s\n",
                    n, gname, cname, stale ? "yes" : "no", threads, list.c_str(),
                    zb::opt::isa_name(zb::opt::active_isa()), wait_policy);
        std::printf("  %s", machine.text().c_str());
        std::printf("  through the worker: %.3f ms (%.3f ms of them in the worker)   in-process: "
                    "%.3f ms   ratio %.4f (median of %d step pairs)\n",
                    median(tw) * 1e3, median(town) * 1e3, median(tl) * 1e3, ratio, iterations);
        std::printf("  checked steps: skip non-finite %.3f ms (ratio %.4f to a plain worker step), "
                    "skip + norm + clip %.3f ms (ratio %.4f)\n",
                    median(tskip) * 1e3, skip_ratio, median(tclip) * 1e3, clip_ratio);
        std::printf("  bytes/param: %.3f measured (RSS of both processes), %.3f by layout; worker "
                    "RSS grew %ld bytes after the first steps\n",
                    bpp, mem.bytes_per_param, growth);
    }
    return 0;
}
