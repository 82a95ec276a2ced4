#include "common.hpp"

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

bool take_value(int argc, char **argv, int &i, std::string &value) {
    if (i + 1 >= argc) return false;
    value = argv[++i];
    return true;
}

} // namespace zb::cli
