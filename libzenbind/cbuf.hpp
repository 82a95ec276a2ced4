// Handing library strings to C callers through (buf, len) pairs, with snprintf's contract.
#pragma once

#include <cstring>
#include <string_view>

namespace zb {

// Copies as much of `text` as fits into buf, always NUL-terminated when len > 0; returns the
// length the whole text needs, excluding the NUL, as snprintf does.
inline size_t copy_to_buffer(std::string_view text, char *buf, size_t len) noexcept {
    if (buf && len > 0) {
        const size_t n = text.size() < len ? text.size() : len - 1;
        std::memcpy(buf, text.data(), n);
        buf[n] = '\0';
    }
    return text.size();
}

} // namespace zb
