#include "common.hpp"

#include <zbutil/openmp_binding.hpp>

#include <cstdio>

namespace zb::cli {

int error(int status, const std::string &message) {
    std::fprintf(stderr, "zenbind: %s\n", message.c_str());
    return status;
}

int zb_error(int status, const std::string &what) {
    return error(status, what + ": " + zb_last_error());
}

std::string json_string(const std::string &text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

int this_process_cpus(zb_cpuset_t *out, char *source, size_t source_len) {
    if (zb_allowed_cpus(nullptr, 0, out, source, source_len) != ZB_OK)
        return zb_error(kRuntime, "cannot read this process's allowed CPUs");
    if (util::openmp_binds())
        return error(kRuntime, std::string(util::kOpenmpBindingHelp) + ": it pinned it to CPU " +
                                   cpulist(out) +
                                   " before zenbind started, so this machine would read as that; " +
                                   util::kOpenmpUnbindHelp);
    return kOk;
}

bool take_value(int argc, char **argv, int &i, std::string &value) {
    if (i + 1 >= argc) return false;
    value = argv[++i];
    return true;
}

} // namespace zb::cli
