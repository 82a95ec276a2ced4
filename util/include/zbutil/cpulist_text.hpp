// A CPU set as the text users read and write ("0-15,32-47"), for C++ callers of the C ABI's
// zb_cpulist_format: zenbind's output and the plugin's messages.
#pragma once

#include <zenbind/zenbind.h>

#include <string>

namespace zb::util {

// The set's cpulist ("" for the empty set), or "infinite" for a set with no last CPU.
inline std::string cpulist(const zb_cpuset_t *set) {
    char small[256];
    const int n = zb_cpulist_format(set, small, sizeof small);
    if (n < 0) return "infinite";
    if (static_cast<size_t>(n) < sizeof small) return small;
    std::string big(static_cast<size_t>(n) + 1, '\0');
    zb_cpulist_format(set, big.data(), big.size());
    big.resize(static_cast<size_t>(n));
    return big;
}

} // namespace zb::util
