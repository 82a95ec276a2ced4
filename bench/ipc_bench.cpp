// zenflow-bench ipc: the round trip of an empty step (submit to done, no groups) between this
// process and a worker on another CPU. Measured twice: with the default short spin (the path every
// step takes when the peer answers within microseconds), and with spinning off (the futex wake
// path an idle worker takes).
#include <zenbind/worker.h>

#include "affinity.hpp"
#include "measure.hpp"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sched.h>
#include <string>
#include <vector>

namespace {

struct Stats {
    double p50, p99, min;
};

Stats measure(int worker_cpu, unsigned spin_us, long iterations) {
    const std::string cpus = std::to_string(worker_cpu); // read by zb_worker_spawn() only
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.cpus = cpus.c_str();
    attr.threads = 1;
    attr.worker_spin_us = spin_us;
    attr.wait_spin_us = spin_us;
    zb_worker_t *w = nullptr;
    if (zb_worker_spawn(&attr, 0, &w) != ZB_OK) {
        std::fprintf(stderr, "zenflow-bench ipc: %s\n", zb_last_error());
        std::exit(1);
    }
    std::vector<double> us;
    us.reserve(static_cast<size_t>(iterations));
    const long warmup = std::min(iterations / 10 + 1, 1000L);
    for (long i = 0; i < warmup + iterations; ++i) {
        const zb_worker_step step{i + 1, 1.0f, 0, nullptr, 0, 0, 0.0f};
        const double t0 = zb::bench::now();
        if (zb_worker_submit(w, &step) != ZB_OK ||
            zb_worker_wait_result(w, 10000, nullptr) != ZB_OK) {
            std::fprintf(stderr, "zenflow-bench ipc: %s\n", zb_last_error());
            std::exit(1);
        }
        const double t1 = zb::bench::now();
        if (i >= warmup) us.push_back((t1 - t0) * 1e6);
    }
    zb_worker_destroy(w);
    std::sort(us.begin(), us.end());
    const auto at = [&](double q) { return us[static_cast<size_t>(q * double(us.size() - 1))]; };
    return Stats{at(0.5), at(0.99), us.front()};
}

} // namespace

int bench_ipc(int argc, char **argv) {
    const zb::bench::Machine machine;
    long iterations = 100000;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--json")) {
            json = true;
        } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
            char *end = nullptr;
            iterations = std::strtol(argv[++i], &end, 10);
            if (*end || iterations < 10 || iterations > 100000000) {
                std::fprintf(stderr, "zenflow-bench ipc: --iterations takes 10 to 100000000\n");
                return 2;
            }
        } else {
            std::fprintf(stderr,
                         "zenflow-bench ipc: bad argument '%s' (usage: zenflow-bench ipc "
                         "--help)\n",
                         argv[i]);
            return 2;
        }
    }
    Affinity affinity;
    if (!read_affinity(affinity)) {
        std::perror("zenflow-bench: sched_getaffinity");
        return 1;
    }
    const std::vector<int> &cpus = affinity.cpus;
    if (cpus.size() < 2) {
        std::fprintf(stderr, "zenflow-bench ipc: needs two CPUs, this process may use %zu\n",
                     cpus.size());
        return 1;
    }
    // The trainer on the first CPU, the worker on the last one (another core on most layouts).
    const int tcpu = cpus.front(), wcpu = cpus.back();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(tcpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    const unsigned spin_us = 50; // zb_worker_attr_init's default
    const Stats spin = measure(wcpu, spin_us, iterations);
    const Stats sleep = measure(wcpu, 0, std::max(iterations / 10, 10L));
    sched_setaffinity(0, sizeof affinity.mask, &affinity.mask);
    if (json) {
        std::printf("{\"iterations\": %ld, \"trainer_cpu\": %d, \"worker_cpu\": %d, "
                    "\"spin_us\": %u, \"p50_us\": %.3f, \"p99_us\": %.3f, \"min_us\": %.3f, "
                    "\"futex_p50_us\": %.3f, \"futex_p99_us\": %.3f, %s}\n",
                    iterations, tcpu, wcpu, spin_us, spin.p50, spin.p99, spin.min, sleep.p50,
                    sleep.p99, machine.json().c_str());
    } else {
        std::printf("empty-step round trip, trainer on CPU %d, worker on CPU %d, %ld steps\n", tcpu,
                    wcpu, iterations);
        std::printf("  %s", machine.text().c_str());
        std::printf("  spin %3u us then futex: p50 %8.3f us  p99 %8.3f us  min %8.3f us\n", spin_us,
                    spin.p50, spin.p99, spin.min);
        std::printf("  futex only (no spin):   p50 %8.3f us  p99 %8.3f us  min %8.3f us\n",
                    sleep.p50, sleep.p99, sleep.min);
    }
    return 0;
}
