#include <zbutil/decimal.hpp>

namespace zb::util {

bool is_decimal(std::string_view text) {
    if (text.empty()) return false;
    for (char c : text)
        if (c < '0' || c > '9') return false;
    return true;
}

std::optional<uint64_t> parse_decimal(std::string_view text, uint64_t max) {
    if (!is_decimal(text)) return std::nullopt;
    uint64_t value = 0;
    for (char c : text) {
        const uint64_t digit = static_cast<uint64_t>(c - '0');
        if (digit > max || value > (max - digit) / 10) return std::nullopt; // value*10+digit > max
        value = value * 10 + digit;
    }
    return value;
}

} // namespace zb::util
