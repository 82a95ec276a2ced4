// Plain decimal numbers as users and the kernel write them: digits only, no sign, space, base
// prefix or locale.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace zb::util {

// Whether `text` is one or more decimal digits and nothing else.
bool is_decimal(std::string_view text);

// The number `text` writes, if it is decimal digits only and at most `max`; nothing otherwise.
// Never overflows: a number past `max` is nothing, however many digits it has.
std::optional<uint64_t> parse_decimal(std::string_view text, uint64_t max);

} // namespace zb::util
