// zenbind: preview and inspect zenflow-bind's core plans (zenbind(1)).
#include "commands.hpp"
#include "common.hpp"
#include "gnu_args.hpp"
#include "tune.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Command {
    const char *name;
    int (*run)(int, char **);
    const char *usage;
};

const Command commands[] = {
    {"plan", zb::cli::cmd_plan,
     "zenbind plan --tasks N [--synthetic STRING | --topology FILE.xml] [--cpuset LIST]\n"
     "             [--options OPTS] [--json] [--picture FILE.svg|FILE.png]\n"
     "             [--gpu-nodes NODE|-,... | --gpus LIST [--gpu-root DIR | --gpumap FILE]]\n"
     "  What each of N local tasks gets: training and optimizer CPUs, thread counts, NUMA\n"
     "  nodes, each task beside its GPU. Default: this machine and this process's allowed CPUs."},
    {"show", zb::cli::cmd_show,
     "zenbind show [--json]\n"
     "  This process's allowed CPUs, the cgroup file they came from, and the topology by NUMA\n"
     "  node."},
    {"tune", zb_cli_tune,
     "zenbind tune --output FILE [--elements N] [--steps K] [--max-cores N] [--json]\n"
     "  Measure on each NUMA node how many optimizer cores saturate memory bandwidth for the\n"
     "  Adam step and write a profile for the plugin's profile= key."},
};

void usage(FILE *to) {
    std::fprintf(to, "usage: zenbind COMMAND [ARGS]   (zenbind help COMMAND, man zenbind)\n\n");
    for (const Command &c : commands)
        std::fprintf(to, "%s\n\n", c.usage);
}

const Command *find(const char *name) {
    for (const Command &c : commands)
        if (std::strcmp(c.name, name) == 0) return &c;
    return nullptr;
}

} // namespace

int main(int argc, char **argv) {
    // hwloc says why a --synthetic string or --topology file is refused only when asked to; the
    // CLI lets it, on stderr before zenbind's own message.
    setenv("HWLOC_SYNTHETIC_VERBOSE", "1", 0);
    setenv("HWLOC_XML_VERBOSE", "1", 0);
    if (argc < 2) {
        usage(stderr);
        return zb::cli::kUsage;
    }
    const std::string first = argv[1];
    if (first == "--help" || first == "-h" || (first == "help" && argc == 2)) {
        usage(stdout);
        return zb::cli::kOk;
    }
    if (first == "--version") {
        std::printf("zenbind %s\n", zb_version());
        return zb::cli::kOk;
    }
    if (first == "help") {
        if (argc > 3)
            return zb::cli::error(zb::cli::kUsage, "help takes one command, not '" +
                                                       std::string(argv[3]) + "' after it");
        const Command *c = find(argv[2]);
        if (!c) return zb::cli::error(zb::cli::kUsage, std::string("no command '") + argv[2] + "'");
        std::printf("%s\n", c->usage);
        return zb::cli::kOk;
    }
    const Command *c = find(argv[1]);
    if (!c)
        return zb::cli::error(zb::cli::kUsage,
                              "unknown command '" + first + "' (commands: plan, show, tune)");
    // GNU style for every command: CMD --help, and --opt=value as well as --opt value.
    std::vector<std::string> args = zb::cli::gnu_args(argc, argv, 2);
    for (const std::string &a : args)
        if (a == "--help" || a == "-h") {
            std::printf("%s\n", c->usage);
            return zb::cli::kOk;
        }
    std::vector<char *> ptrs = zb::cli::argv_of(args);
    return c->run(static_cast<int>(args.size()), ptrs.data());
}
