// zenflow-bench: one subcommand per benchmark; each prints figures measured side by side in one
// run.
#include "gnu_args.hpp"

#include <zenbind/zenbind.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>
#include <zbutil/openmp_binding.hpp>

int bench_adam(int argc, char **argv);
int bench_ipc(int argc, char **argv);
int bench_worker(int argc, char **argv);

namespace {

struct Subcommand {
    const char *name;
    int (*run)(int argc, char **argv); // argv[0] is the subcommand's name
    const char *summary;
    const char *usage; // for SUBCOMMAND --help; a usage error points there
};

const Subcommand kSubcommands[] = {
    {"adam", bench_adam, "the Adam/AdamW kernel against a streaming roofline over the same bytes",
     "zenflow-bench adam --elements N [--threads T] [--grad fp32|bf16|fp16]\n"
     "                   [--copy-out none|bf16|fp16] [--stale] [--isa scalar|avx2|avx512]\n"
     "                   [--stores auto|cached|streaming] [--prefetch auto|off|l1|l2]\n"
     "                   [--vs-isa scalar|avx2|avx512] [--vs-prefetch auto|off|l1|l2]\n"
     "                   [--steps K] [--json]"},
    {"ipc", bench_ipc, "round trip of an empty step between this process and a worker",
     "zenflow-bench ipc [--iterations K] [--json]"},
    {"worker", bench_worker, "a step through the worker against the same kernel in-process",
     "zenflow-bench worker --elements N [--grad fp32|bf16|fp16] [--copy-out bf16|fp16] [--stale]\n"
     "                     [--threads T] [--iterations I] [--json]"},
};

int usage(FILE *out) {
    std::fprintf(out, "usage: zenflow-bench SUBCOMMAND [OPTIONS]  (see zenflow-bench(1))\n");
    for (const Subcommand &s : kSubcommands)
        std::fprintf(out, "  %-8s %s\n", s.name, s.summary);
    return out == stdout ? 0 : 2;
}

// Run from a build tree (build/default/bench/zenflow-bench), the worker to measure is that tree's
// (build/default/optimizer/zenflow-optimizer), not an installed one: set ZENFLOW_OPTIMIZER to it
// unless the user did.
void prefer_build_tree_worker() {
    if (std::getenv(ZB_ENV_OPTIMIZER)) return;
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    const std::string exe(self, static_cast<size_t>(n));
    const std::string dir = exe.substr(0, exe.rfind('/'));
    const std::string worker = dir.substr(0, dir.rfind('/')) + "/optimizer/zenflow-optimizer";
    if (dir.size() > 6 && dir.compare(dir.size() - 6, 6, "/bench") == 0 &&
        access(worker.c_str(), X_OK) == 0)
        setenv(ZB_ENV_OPTIMIZER, worker.c_str(), 0);
}

// The worker's team waits between steps as zb_worker_spawn() sets it up: OMP_WAIT_POLICY=passive
// unless the caller chose a policy. `worker` runs its in-process reference on the same CPUs, so it
// must wait the same way: under libgomp's default its idle threads spin for milliseconds after
// each in-process step, on the CPUs the next worker step runs on (a 2-thread worker step took
// 1.06x the in-process one right after it and 1.00x before it, on a 2-vCPU Intel Xeon guest).
// libgomp reads the policy once, before main, so this re-executes the benchmark with it set; if
// that fails, the run goes on with the default policy, which the report names.
void wait_as_the_worker(char **argv) {
    if (std::getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY");
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) return usage(stdout);
    if (!std::strcmp(argv[1], "worker")) wait_as_the_worker(argv);
    prefer_build_tree_worker();
    std::vector<std::string> args = zb::cli::gnu_args(argc, argv, 1);
    std::vector<char *> ptrs = zb::cli::argv_of(args);
    for (const Subcommand &s : kSubcommands) {
        if (std::strcmp(argv[1], s.name) != 0) continue;
        for (const std::string &a : args)
            if (a == "--help" || a == "-h") {
                std::printf("usage: %s\n%s (see zenflow-bench(1))\n", s.usage, s.summary);
                return 0;
            }
        // libgomp pins this process to its first place before main() where OMP_PROC_BIND,
        // OMP_PLACES or GOMP_CPU_AFFINITY say so: every figure would be that place's
        if (zb::util::openmp_binds()) {
            std::fprintf(stderr,
                         "zenflow-bench %s: %s to one place before the benchmark starts; %s\n",
                         s.name, zb::util::kOpenmpBindingHelp, zb::util::kOpenmpUnbindHelp);
            return 1;
        }
        return s.run(static_cast<int>(args.size()), ptrs.data());
    }
    std::fprintf(stderr, "zenflow-bench: unknown subcommand '%s'\n", argv[1]);
    return usage(stderr);
}
