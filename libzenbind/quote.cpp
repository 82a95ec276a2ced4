#include "quote.hpp"

#include <cstdio>

namespace zb {
namespace {
// Longest quoted excerpt in a message: enough to recognise the input, short enough for a log line.
constexpr size_t quote_window = 64;

} // namespace

std::string quote_input(std::string_view text, size_t around) {
    size_t begin = 0;
    size_t end = text.size();
    if (end > quote_window) {
        begin = around > quote_window / 2 ? around - quote_window / 2 : 0;
        if (begin > text.size() - quote_window) begin = text.size() - quote_window;
        end = begin + quote_window;
    }
    std::string out = begin > 0 ? "'..." : "'";
    for (size_t i = begin; i < end; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') {
            char hex[5];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        } else {
            out += static_cast<char>(c);
        }
    }
    out += end < text.size() ? "...'" : "'";
    return out;
}

} // namespace zb
