// zb_cpulist_parse on arbitrary text: an accepted list formats to a canonical text that parses
// back to the same set (and formats to itself); a rejected one leaves a message.
#include "check.hpp"

#include <zenbind/zenbind.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace {

struct Sets {
    zb_cpuset_t *set = zb_cpuset_alloc();
    zb_cpuset_t *back = zb_cpuset_alloc();
};

bool only_list_bytes(const std::string &text) {
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        const bool ok =
            (c >= '0' && c <= '9') || c == ',' || c == '-' || (c == '\n' && i + 1 == text.size());
        if (!ok) return false;
    }
    return true;
}

std::string format(const zb_cpuset_t *set) {
    const int n = zb_cpulist_format(set, nullptr, 0);
    ZB_FUZZ_CHECK(n >= 0);
    std::string text(static_cast<size_t>(n) + 1, '\0');
    ZB_FUZZ_CHECK(zb_cpulist_format(set, text.data(), text.size()) == n);
    ZB_FUZZ_CHECK(std::strlen(text.c_str()) == static_cast<size_t>(n));
    text.resize(static_cast<size_t>(n));
    return text;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Sets b;
    // A C caller's string ends at the first NUL, so the parser sees the text up to there.
    const std::string text(reinterpret_cast<const char *>(data), size);
    if (zb_cpulist_parse(text.c_str(), b.set) != ZB_OK) {
        ZB_FUZZ_CHECK(zb_last_error()[0] != '\0');
        ZB_FUZZ_CHECK(std::strlen(zb_last_error()) < 512);
        return 0;
    }
    const std::string accepted(text.c_str());
    ZB_FUZZ_CHECK(only_list_bytes(accepted));
    ZB_FUZZ_CHECK(zb_cpuset_weight(b.set) >= 0);                   // finite
    ZB_FUZZ_CHECK(zb_cpuset_next(b.set, ZB_CPULIST_MAX_ID) == -1); // nothing above the maximum

    const std::string canonical = format(b.set);
    ZB_FUZZ_CHECK(zb_cpulist_parse(canonical.c_str(), b.back) == ZB_OK);
    ZB_FUZZ_CHECK(zb_cpuset_isequal(b.set, b.back));
    ZB_FUZZ_CHECK(format(b.back) == canonical);
    return 0;
}
