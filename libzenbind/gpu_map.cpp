#include "gpu_map.hpp"

#include "error.hpp"
#include "quote.hpp"

#include <zenbind/zenbind.h>

namespace zb {
namespace {

bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A decimal number lo..hi without sign, leading '+' or exponent.
bool read_number(std::string_view s, unsigned hi, unsigned &out) {
    if (s.empty() || s.size() > 6) return false;
    unsigned value = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        value = value * 10 + static_cast<unsigned>(c - '0');
    }
    if (value > hi) return false;
    out = value;
    return true;
}

// A PCI address as sysfs names it, "0000:07:00.0" (domain:bus:device.function, hex).
// DOMAIN:BB:DD.F in hex, the domain of 4 to 8 digits: sysfs writes 4, or 5 for a VMD domain
// (10000:e1:00.0); nvidia-smi writes 8.
bool is_bus_id(std::string_view s) {
    static constexpr std::string_view shape = ":hh:hh.h";
    const size_t domain = s.size() > shape.size() ? s.size() - shape.size() : 0;
    if (domain < 4 || domain > 8) return false;
    for (size_t i = 0; i < s.size(); ++i)
        if (i < domain || shape[i - domain] == 'h' ? !is_hex(s[i]) : s[i] != shape[i - domain])
            return false;
    return true;
}

std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t'))
            ++i;
        const size_t begin = i;
        while (i < line.size() && line[i] != ' ' && line[i] != '\t')
            ++i;
        if (i > begin) out.push_back(line.substr(begin, i - begin));
    }
    return out;
}

} // namespace

std::vector<MapEntry> parse_gpu_map(std::string_view text, std::string_view name) {
    if (text.size() > max_map_bytes)
        fail(ZB_EINVAL, "GPU map " + std::string(name) + " is larger than " +
                            std::to_string(max_map_bytes) + " bytes");
    std::vector<MapEntry> out;
    std::vector<bool> seen(ZB_GPU_MAX_INDEX + 1, false);
    size_t begin = 0;
    for (unsigned lineno = 1; begin < text.size(); ++lineno) {
        size_t end = text.find('\n', begin);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(begin, end - begin);
        begin = end + 1;
        const std::string where =
            "GPU map " + std::string(name) + " line " + std::to_string(lineno) + ": ";
        if (const size_t hash = line.find('#'); hash != std::string_view::npos)
            line = line.substr(0, hash);
        for (size_t i = 0; i < line.size(); ++i)
            if (static_cast<unsigned char>(line[i]) < 0x20 && line[i] != '\t')
                fail(ZB_EINVAL, where + "control character in " + quote_input(line, i));
        const auto w = words(line);
        if (w.empty()) continue;
        if (w.size() > 3)
            fail(ZB_EINVAL, where + "expected 'INDEX NODE [BUS-ID]', got " + quote_input(line));
        MapEntry e{0, 0, ""};
        if (!read_number(w[0], ZB_GPU_MAX_INDEX, e.index))
            fail(ZB_EINVAL, where + "bad GPU index " + quote_input(w[0]) + " (accepted: 0.." +
                                std::to_string(ZB_GPU_MAX_INDEX) + ")");
        if (w.size() < 2)
            fail(ZB_EINVAL, where + "GPU " + std::to_string(e.index) + " has no NUMA node");
        if (!read_number(w[1], ZB_CPULIST_MAX_ID, e.node))
            fail(ZB_EINVAL, where + "bad NUMA node " + quote_input(w[1]) + " (accepted: 0.." +
                                std::to_string(ZB_CPULIST_MAX_ID) + ")");
        if (w.size() == 3) {
            if (!is_bus_id(w[2]))
                fail(ZB_EINVAL,
                     where + "bad PCI bus id " + quote_input(w[2]) +
                         " (accepted: DDDD:BB:DD.F in hex, a domain of 4 to 8 digits, as in "
                         "/sys/bus/pci/devices)");
            for (char c : w[2])
                e.bus += (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a') : c;
        }
        if (seen[e.index])
            fail(ZB_EINVAL, where + "GPU " + std::to_string(e.index) + " is listed twice");
        seen[e.index] = true;
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<unsigned> parse_gpu_list(std::string_view text) {
    std::vector<unsigned> out;
    size_t begin = 0;
    for (;;) {
        const size_t comma = text.find(',', begin);
        const std::string_view item =
            text.substr(begin, comma == std::string_view::npos ? text.npos : comma - begin);
        unsigned index = 0;
        if (!read_number(item, ZB_GPU_MAX_INDEX, index) || out.size() > ZB_GPU_MAX_INDEX)
            fail(ZB_EINVAL, "bad GPU list " + quote_input(text, begin) +
                                " (accepted: GPU indexes 0.." + std::to_string(ZB_GPU_MAX_INDEX) +
                                " separated by commas, such as 0,1,2)");
        out.push_back(index);
        if (comma == std::string_view::npos) return out;
        begin = comma + 1;
    }
}

} // namespace zb
