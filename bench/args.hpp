// Command-line numbers and usage errors, as every zenflow-bench subcommand reads and reports them.
#pragma once

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace zb::bench {

// A decimal integer in [1, max], the whole of `s` (no sign, no suffix).
inline bool parse_count(const char *s, unsigned long long max, unsigned long long &out) {
    if (!*s || *s == '-' || *s == '+') return false;
    char *end = nullptr;
    errno = 0;
    out = std::strtoull(s, &end, 10);
    return errno == 0 && *end == 0 && out >= 1 && out <= max;
}

// "zenflow-bench SUBCOMMAND: <message> (usage: zenflow-bench SUBCOMMAND --help)"; returns 2, the
// exit status of a usage error.
inline int vbad_usage(const char *subcommand, const char *fmt, va_list args) {
    std::fprintf(stderr, "zenflow-bench %s: ", subcommand);
    std::vfprintf(stderr, fmt, args);
    std::fprintf(stderr, " (usage: zenflow-bench %s --help)\n", subcommand);
    return 2;
}

[[gnu::format(printf, 2, 3)]] inline int bad_usage(const char *subcommand, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    const int status = vbad_usage(subcommand, fmt, args);
    va_end(args);
    return status;
}

} // namespace zb::bench
