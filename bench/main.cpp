// zenflow-bench: one subcommand per benchmark; each prints figures measured side by side in one
// run.
#include <cstdio>
#include <cstring>

int bench_adam(int argc, char **argv);
int bench_ipc(int argc, char **argv);
int bench_worker(int argc, char **argv);

namespace {

struct Subcommand {
    const char *name;
    int (*run)(int argc, char **argv); // argv[0] is the subcommand's name
    const char *summary;
};

const Subcommand kSubcommands[] = {
    {"adam", bench_adam, "the Adam/AdamW kernel against a streaming roofline over the same bytes"},
    {"ipc", bench_ipc, "round trip of an empty step between this process and a worker"},
    {"worker", bench_worker, "a step through the worker against the same kernel in-process"},
};

int usage(FILE *out) {
    std::fprintf(out, "usage: zenflow-bench SUBCOMMAND [OPTIONS]  (see zenflow-bench(1))\n");
    for (const Subcommand &s : kSubcommands)
        std::fprintf(out, "  %-8s %s\n", s.name, s.summary);
    return out == stdout ? 0 : 2;
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) return usage(stdout);
    for (const Subcommand &s : kSubcommands)
        if (!std::strcmp(argv[1], s.name)) return s.run(argc - 1, argv + 1);
    std::fprintf(stderr, "zenflow-bench: unknown subcommand '%s'\n", argv[1]);
    return usage(stderr);
}
