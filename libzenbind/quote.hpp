// Quoting untrusted input inside error messages (cpu lists, options, profiles).
#pragma once

#include <string>
#include <string_view>

namespace zb {

// `text` between single quotes, safe to show to a user: control and non-ASCII bytes become \xNN,
// and text longer than a message should carry is cut to a window around byte `around`.
std::string quote_input(std::string_view text, size_t around = 0);

} // namespace zb
