#include <zbutil/decimal.hpp>
#include <zbutil/proc_status.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace zb::util {

size_t proc_status_bytes(pid_t pid, const char *field) {
    char path[64];
    if (pid == 0)
        std::snprintf(path, sizeof path, "/proc/self/status");
    else
        std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
    FILE *f = std::fopen(path, "re");
    if (!f) return 0;
    char line[256];
    size_t value = 0;
    const size_t len = std::strlen(field);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, field, len) != 0 || line[len] != ':') continue;
        // "VmRSS:\t  123456 kB"
        std::string_view rest(line + len + 1);
        rest.remove_prefix(std::min(rest.find_first_not_of(" \t"), rest.size()));
        const auto kb = parse_decimal(rest.substr(0, rest.find(' ')), SIZE_MAX / 1024);
        value = kb ? static_cast<size_t>(*kb) * 1024 : 0;
        break;
    }
    std::fclose(f);
    return value;
}

} // namespace zb::util
