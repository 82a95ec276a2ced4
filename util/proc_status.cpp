#include <zbutil/decimal.hpp>
#include <zbutil/proc_status.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace zb::util {

namespace {

// The text after "field:" on its line of /proc/PID/status (blanks skipped), into out; false when
// the process or the field is not there.
bool field_text(pid_t pid, const char *field, char (&out)[256]) {
    char path[64];
    if (pid == 0)
        std::snprintf(path, sizeof path, "/proc/self/status");
    else
        std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
    FILE *f = std::fopen(path, "re");
    if (!f) return false;
    char line[256];
    bool found = false;
    const size_t len = std::strlen(field);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, field, len) != 0 || line[len] != ':') continue;
        const char *rest = line + len + 1;
        rest += std::strspn(rest, " \t");
        std::snprintf(out, sizeof out, "%s", rest);
        found = true;
        break;
    }
    std::fclose(f);
    return found;
}

} // namespace

size_t proc_status_bytes(pid_t pid, const char *field) {
    char text[256];
    if (!field_text(pid, field, text)) return 0;
    // "VmRSS:\t  123456 kB"
    const std::string_view rest(text);
    const auto kb = parse_decimal(rest.substr(0, rest.find(' ')), SIZE_MAX / 1024);
    return kb ? static_cast<size_t>(*kb) * 1024 : 0;
}

char proc_state(pid_t pid) {
    char text[256];
    // "State:\tT (stopped)"
    return field_text(pid, "State", text) ? text[0] : '\0';
}

} // namespace zb::util
