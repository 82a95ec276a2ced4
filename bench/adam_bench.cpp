// zenflow-bench adam: median seconds per Adam step against a plain streaming pass over the same
// bytes (roofline.hpp), alternated step by step in one run so both see the same machine noise; and,
// with --vs-isa or --vs-prefetch, against a second configuration of the kernel on the same buffers.
#include "prefetch_choice.hpp" // timed_kind(): the calls the choice times
#include "roofline.hpp"
#include <zbadam/adam.hpp>

#include "affinity.hpp"
#include "args.hpp"
#include "measure.hpp"
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <omp.h>
#include <optional>

#include <sched.h>
#include <string>
#include <utility>
#include <vector>

namespace {

// What a step of the kernel runs with, besides the batch.
struct Variant {
    zb::opt::Isa isa = zb::opt::best_isa();
    zb::opt::Prefetch prefetch = zb::opt::requested_prefetch();
};

struct Options {
    size_t elements = 0;
    int threads = 1;
    zb::opt::GradType grad = zb::opt::GradType::f32;
    zb::opt::CopyType copy = zb::opt::CopyType::none;
    bool stale = false;
    Variant kernel;
    std::optional<zb::opt::Isa> vs_isa;
    std::optional<zb::opt::Prefetch> vs_prefetch;
    zb::opt::Stores stores = zb::opt::Stores::automatic;
    int steps = 20;
    bool json = false;
};

[[gnu::format(printf, 1, 2)]] int bad_usage(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    const int status = zb::bench::vbad_usage("adam", fmt, args);
    va_end(args);
    return status;
}

using zb::bench::median;
using zb::bench::now;
using zb::bench::parse_count;
using zb::bench::untouched;
using zb::opt::CopyType;
using zb::opt::GradType;
using zb::opt::Isa;
using zb::opt::Prefetch;
using zb::opt::prefetch_name;
using zb::opt::Stores;

// Sets `out` to the value named `word` among `names`; false if none is.
template <class E>
bool pick(const char *word, std::initializer_list<std::pair<const char *, E>> names, E &out) {
    for (const auto &[name, value] : names)
        if (!std::strcmp(word, name)) {
            out = value;
            return true;
        }
    return false;
}

// Returns 0, or the exit status of a usage error.
int parse(int argc, char **argv, Options &o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        unsigned long long n = 0;
        if (a == "--stale")
            o.stale = true;
        else if (a == "--json")
            o.json = true;
        else if (!has_value)
            return bad_usage("unknown option or missing value: '%s'", argv[i]);
        else if (a == "--elements") {
            if (!parse_count(argv[++i], 1ull << 40, n))
                return bad_usage("--elements wants an integer in [1, 2^40], not '%s'", argv[i]);
            o.elements = n;
        } else if (a == "--threads") {
            if (!parse_count(argv[++i], 4096, n))
                return bad_usage("--threads wants an integer in [1, 4096], not '%s'", argv[i]);
            o.threads = static_cast<int>(n);
        } else if (a == "--steps") {
            if (!parse_count(argv[++i], 1000000, n) || n < 10)
                return bad_usage("--steps wants an integer in [10, 1000000], not '%s'", argv[i]);
            o.steps = static_cast<int>(n);
        } else if (a == "--grad") {
            if (!pick(argv[++i],
                      {{"fp32", GradType::f32}, {"bf16", GradType::bf16}, {"fp16", GradType::f16}},
                      o.grad))
                return bad_usage("--grad wants fp32, bf16 or fp16, not '%s'", argv[i]);
        } else if (a == "--copy-out") {
            if (!pick(argv[++i],
                      {{"none", CopyType::none}, {"bf16", CopyType::bf16}, {"fp16", CopyType::f16}},
                      o.copy))
                return bad_usage("--copy-out wants none, bf16 or fp16, not '%s'", argv[i]);
        } else if (a == "--stores") {
            if (!pick(argv[++i],
                      {{"auto", Stores::automatic},
                       {"cached", Stores::cached},
                       {"streaming", Stores::streaming}},
                      o.stores))
                return bad_usage("--stores wants auto, cached or streaming, not '%s'", argv[i]);
        } else if (a == "--isa" || a == "--vs-isa") {
            Isa isa = Isa::scalar;
            if (!pick(argv[++i],
                      {{"scalar", Isa::scalar},
                       {"avx2", Isa::avx2},
                       {"avx512", Isa::avx512},
                       {"neon", Isa::neon},
                       {"sve", Isa::sve}},
                      isa))
                return bad_usage("%s wants scalar, avx2, avx512, neon or sve, not '%s'", a.c_str(),
                                 argv[i]);
            if (!zb::opt::isa_supported(isa))
                return bad_usage("this build or CPU does not support %s %s", a.c_str(), argv[i]);
            (a == "--isa" ? o.kernel.isa : o.vs_isa.emplace()) = isa;
        } else if (a == "--prefetch" || a == "--vs-prefetch") {
            Prefetch where = Prefetch::off;
            if (!pick(argv[++i],
                      {{"off", Prefetch::off},
                       {"l1", Prefetch::l1},
                       {"l2", Prefetch::l2},
                       {"auto", Prefetch::automatic}},
                      where))
                return bad_usage("%s wants off, l1, l2 or auto, not '%s'", a.c_str(), argv[i]);
            (a == "--prefetch" ? o.kernel.prefetch : o.vs_prefetch.emplace()) = where;
        } else
            return bad_usage("unknown option '%s'", argv[i]);
    }
    if (o.elements == 0) return bad_usage("%s", "--elements is required");
    return 0;
}

// The configuration --vs-isa and --vs-prefetch ask for (what they leave out is the kernel's), if
// any.
std::optional<Variant> versus(const Options &o) {
    if (!o.vs_isa && !o.vs_prefetch) return std::nullopt;
    return Variant{o.vs_isa.value_or(o.kernel.isa), o.vs_prefetch.value_or(o.kernel.prefetch)};
}

// Makes adam_step run `v`; false if this CPU cannot (parse() checked it; kept as a guard).
bool use(const Variant &v) {
    if (!zb::opt::force_isa(v.isa)) {
        std::fprintf(stderr, "zenflow-bench adam: this CPU cannot run --isa %s\n",
                     zb::opt::isa_name(v.isa));
        return false;
    }
    zb::opt::force_prefetch(v.prefetch);
    return true;
}

// The prefetch mode of a variant; for auto, what the run-time choice came to ("auto:off"), once
// a step was large enough to make it.
std::string prefetch_text(const Variant &v) {
    const zb::opt::Prefetch chosen = zb::opt::chosen_prefetch();
    if (v.prefetch != zb::opt::Prefetch::automatic || chosen == zb::opt::Prefetch::automatic)
        return zb::opt::prefetch_name(v.prefetch); // "auto": no step was large enough to choose
    return std::string("auto:") + zb::opt::prefetch_name(chosen);
}

const char *grad_name(zb::opt::GradType g) {
    return g == zb::opt::GradType::f32 ? "fp32" : g == zb::opt::GradType::bf16 ? "bf16" : "fp16";
}

const char *copy_name(zb::opt::CopyType c) {
    return c == zb::opt::CopyType::none ? "none" : c == zb::opt::CopyType::bf16 ? "bf16" : "fp16";
}

} // namespace

int bench_adam(int argc, char **argv) {
    Options o;
    if (const int rc = parse(argc, argv, o)) return rc;
    const zb::bench::Machine machine;

    Affinity affinity;
    if (!read_affinity(affinity)) {
        std::perror("zenflow-bench adam: sched_getaffinity");
        return 1;
    }
    const std::vector<int> &cpus = affinity.cpus;
    if (o.threads > static_cast<int>(cpus.size())) {
        std::fprintf(stderr, "zenflow-bench adam: --threads %d but only %zu CPUs in the affinity\n",
                     o.threads, cpus.size());
        return 2;
    }
    const std::optional<Variant> vs = versus(o);
    if (!use(o.kernel) || (vs && !use(*vs))) return 2;
    zb::opt::force_stores(o.stores);
    omp_set_dynamic(0);

    const size_t n = o.elements, gsize = o.grad == zb::opt::GradType::f32 ? 4 : 2;
    const size_t csize = o.copy == zb::opt::CopyType::none ? 0 : 2;
    zb::opt::AdamHyper hyper;
    hyper.weight_decay = 0.01f;
    const char *who = "zenflow-bench adam";
    const auto param = untouched<float>(n, who), m = untouched<float>(n, who),
               v = untouched<float>(n, who), stale = untouched<float>(o.stale ? n : 0, who);
    const auto grad = untouched<unsigned char>(gsize * n, who),
               copy = untouched<unsigned char>(csize * n, who);
    const zb::opt::AdamTensor t{.param = param.get(),
                                .grad = grad.get(),
                                .exp_avg = m.get(),
                                .exp_avg_sq = v.get(),
                                .copy_out = copy.get(),
                                .stale = stale.get(),
                                .n = n,
                                .hyper = &hyper};
    const zb::opt::AdamBatch batch{o.grad, o.copy, &t, 1};

    // Pin thread k to the k-th allowed CPU (libgomp keeps the same threads for later regions of
    // the same size) and let each touch the slice it will update.
    bool pinned = true;
#pragma omp parallel num_threads(o.threads) reduction(&& : pinned)
    {
        const int me = omp_get_thread_num();
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(me)], &one);
        pinned = sched_setaffinity(0, sizeof one, &one) == 0;
        size_t lo, hi;
        zb::opt::adam_slice(n, me, o.threads, lo, hi);
        for (size_t i = lo; i < hi; ++i) {
            t.param[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
            t.exp_avg[i] = 0.0f;
            t.exp_avg_sq[i] = 0.0f;
            const float g = static_cast<float>(static_cast<int>(i % 17) - 8) * 1e-3f;
            uint32_t u;
            std::memcpy(&u, &g, 4);
            if (gsize == 4)
                static_cast<float *>(const_cast<void *>(t.grad))[i] = g;
            else
                static_cast<uint16_t *>(const_cast<void *>(t.grad))[i] =
                    static_cast<uint16_t>(u >> 16);
        }
        if (csize) std::memset(static_cast<uint16_t *>(t.copy_out) + lo, 0, csize * (hi - lo));
        if (t.stale) std::memset(t.stale + lo, 0, 4 * (hi - lo));
    }
    if (!pinned) {
        std::perror("zenflow-bench adam: sched_setaffinity");
        return 1;
    }
    // fp16 gradients hold the same small values as the bf16 ones would; any finite bits will do.

    // Each step: the kernel, then every form of the roofline pass, then the prefetched pass (a
    // diagnostic, never the roofline); the kernel is held to the fastest form's median. With a
    // second configuration, it runs beside the kernel on the same buffers, before it on odd steps
    // and after it on even ones, and each step gives the ratio of their times: separate buffers
    // would differ by their placement alone (by 8% in one case).
    constexpr size_t forms = std::size(zb::opt::bench::kRoofForms);
    std::vector<double> kernel, roof[forms], prefetched, other, paired;
    const auto timed_step = [&](const Variant &v) {
        use(v);
        const double t0 = now();
        zb::opt::adam_step(batch, o.threads);
        return now() - t0;
    };
    // Two warm-up steps, and more while the run-time prefetch choice is being made (it times
    // kCalibrationPairs pairs of large steps, within at most 8 times as many): the timed steps
    // run in the mode it chose.
    const bool choosing = o.kernel.prefetch == zb::opt::Prefetch::automatic ||
                          (vs && vs->prefetch == zb::opt::Prefetch::automatic);
    const int most = 2 + 8 * zb::opt::kCalibrationPairs * (vs ? 2 : 1);
    int warmup = 2;
    for (int s = 0; s < warmup + o.steps; ++s) {
        if (s == warmup && choosing && warmup < most &&
            zb::opt::chosen_prefetch() == zb::opt::Prefetch::automatic &&
            zb::opt::timed_kind(zb::opt::Kind{n, o.grad, o.copy, o.stale, 1}, o.threads))
            ++warmup;
        hyper.step = s + 1;
        const double b = vs && s % 2 ? timed_step(*vs) : 0;
        const double a = timed_step(o.kernel);
        const double c = vs && s % 2 == 0 ? timed_step(*vs) : b;
        if (s >= warmup) {
            kernel.push_back(a);
            if (vs) other.push_back(c), paired.push_back(a / c);
        }
        for (size_t f = 0; f <= forms; ++f) {
            const double t0 = now();
#pragma omp parallel num_threads(o.threads)
            {
                size_t lo, hi;
                zb::opt::adam_slice(n, omp_get_thread_num(), o.threads, lo, hi);
                zb::opt::bench::stream_pass(t, o.grad, o.copy, lo, hi, o.kernel.isa,
                                            f < forms ? zb::opt::bench::kRoofForms[f]
                                                      : zb::opt::bench::RoofForm::prefetched);
            }
            if (s >= warmup) (f < forms ? roof[f] : prefetched).push_back(now() - t0);
        }
    }

    const double bytes =
        static_cast<double>(n) * static_cast<double>(24 + gsize + csize + (o.stale ? 4 : 0));
    size_t best = 0;
    double rsec = median(roof[0]);
    for (size_t f = 1; f < forms; ++f)
        if (const double m = median(roof[f]); m < rsec) {
            rsec = m;
            best = f;
        }
    const char *form = zb::opt::bench::roof_form_name(zb::opt::bench::kRoofForms[best]);
    std::string each; // every form's GB/s: "simd":x,"lines":y (JSON) or simd x, lines y (table)
    for (size_t f = 0; f < forms; ++f) {
        char one[64];
        std::snprintf(one, sizeof one, o.json ? "%s\"%s\":%.4g" : "%s%s %.2f",
                      f ? (o.json ? "," : ", ") : "",
                      zb::opt::bench::roof_form_name(zb::opt::bench::kRoofForms[f]),
                      bytes / median(roof[f]) / 1e9);
        each += one;
    }
    const double sec = median(kernel);
    const double gelem = static_cast<double>(n) / sec / 1e9, gbs = bytes / sec / 1e9;
    const double rgbs = bytes / rsec / 1e9, ratio = gbs / rgbs;
    const double psec = median(prefetched), pgbs = bytes / psec / 1e9;
    use(o.kernel);
    const char *stores = zb::opt::stores_name(zb::opt::batch_stores(batch));
    std::string versus_text; // the second configuration's JSON object or table line
    if (vs) {
        char line[256];
        const char *isa = zb::opt::isa_name(vs->isa);
        if (o.json)
            std::snprintf(line, sizeof line,
                          ",\"vs\":{\"isa\":\"%s\",\"prefetch\":\"%s\",\"seconds\":%.6g,"
                          "\"time_ratio\":%.4f}",
                          isa, prefetch_name(vs->prefetch), median(other), median(paired));
        else
            std::snprintf(line, sizeof line,
                          "vs        %.6f s/step  (isa %s, prefetch %s)\n"
                          "time      %.3f  kernel/vs, median of paired steps\n",
                          median(other), isa, prefetch_name(vs->prefetch), median(paired));
        versus_text = line;
    }
    if (o.json) {
        std::printf(
            "{\"subcommand\":\"adam\",\"elements\":%zu,\"threads\":%d,\"grad\":\"%s\","
            "\"copy_out\":\"%s\",\"stale\":%s,\"isa\":\"%s\",\"prefetch\":\"%s\",\"stores\":\"%s\","
            "\"steps\":%d,"
            "\"bytes_per_step\":%.0f,\"seconds\":%.6g,\"gelem_per_s\":%.6g,"
            "\"gb_per_s\":%.6g,\"roofline_seconds\":%.6g,\"roofline_gb_per_s\":%.6g,"
            "\"roofline_form\":\"%s\",\"roofline_forms_gb_per_s\":{%s},\"ratio\":%.4f,"
            "\"prefetched_pass_gb_per_s\":%.6g,\"ratio_to_prefetched_pass\":%.4f%s,%s}\n",
            n, o.threads, grad_name(o.grad), copy_name(o.copy), o.stale ? "true" : "false",
            zb::opt::isa_name(zb::opt::active_isa()), prefetch_text(o.kernel).c_str(), stores,
            o.steps, bytes, sec, gelem, gbs, rsec, rgbs, form, each.c_str(), ratio, pgbs,
            gbs / pgbs, versus_text.c_str(), machine.json().c_str());
    } else {
        std::printf("adam: %zu elements, %d threads, grad %s, copy-out %s, stale %s, isa %s, "
                    "prefetch %s, stores %s, %d steps, %.0f bytes/step\n",
                    n, o.threads, grad_name(o.grad), copy_name(o.copy), o.stale ? "yes" : "no",
                    zb::opt::isa_name(zb::opt::active_isa()), prefetch_text(o.kernel).c_str(),
                    stores, o.steps, bytes);
        std::printf("machine   %s", machine.text().c_str());
        std::printf("kernel    %.6f s/step  %.3f Gelem/s  %.2f GB/s\n", sec, gelem, gbs);
        std::printf("roofline  %.6f s/step                 %.2f GB/s  (plain %s pass; GB/s %s)\n",
                    rsec, rgbs, form, each.c_str());
        std::printf("ratio     %.3f\n", ratio);
        std::printf(
            "prefetch  %.6f s/step                 %.2f GB/s  (diagnostic: the nt pass with "
            "the kernel's prefetch; kernel %.3f of it)\n%s",
            psec, pgbs, gbs / pgbs, versus_text.c_str());
    }
    return 0;
}
