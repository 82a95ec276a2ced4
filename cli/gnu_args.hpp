// Command-line conventions shared by zenbind and zenflow-bench: --opt=value is read as --opt value.
#pragma once

#include <string>
#include <vector>

namespace cli {

// argv[first..argc) with every "--opt=value" split in two.
inline std::vector<std::string> gnu_args(int argc, char **argv, int first) {
    std::vector<std::string> args;
    for (int i = first; i < argc; ++i) {
        const std::string a = argv[i];
        const size_t eq = a.find('=');
        if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
            args.push_back(a.substr(0, eq));
            args.push_back(a.substr(eq + 1));
        } else {
            args.push_back(a);
        }
    }
    return args;
}

// A NULL-terminated argv over `args` (which must outlive it).
inline std::vector<char *> argv_of(std::vector<std::string> &args) {
    std::vector<char *> ptrs;
    for (std::string &a : args)
        ptrs.push_back(a.data());
    ptrs.push_back(nullptr);
    return ptrs;
}

} // namespace cli
