#include "cpulist.hpp"
#include "quote.hpp"

#include "bitmap.hpp"
#include "cbuf.hpp"
#include "error.hpp"

#include <zenbind/hwloc.h>

#include <cstdio>
#include <cstring>

namespace zb {

namespace {

[[noreturn]] void bad_list(std::string_view what, std::string_view text, size_t pos,
                           const std::string &why) {
    fail(ZB_EINVAL, "invalid " + std::string(what) + " " + quote_input(text, pos) +
                        " at character " + std::to_string(pos + 1) + ": " + why);
}

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// Reads the decimal id at text[pos...], advancing pos; rejects ids above ZB_CPULIST_MAX_ID before
// they can overflow.
unsigned read_id(std::string_view what, std::string_view text, size_t &pos) {
    const size_t start = pos;
    if (pos >= text.size() || !is_digit(text[pos])) {
        if (pos >= text.size() || text[pos] == ',')
            bad_list(what, text, pos, "expected a CPU number, found an empty item");
        if (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')
            bad_list(what, text, pos, "expected a CPU number, found whitespace (not allowed)");
        bad_list(what, text, pos,
                 "expected a CPU number, found " + quote_input(text.substr(pos, 1)));
    }
    unsigned long value = 0;
    while (pos < text.size() && is_digit(text[pos])) {
        value = value * 10 + static_cast<unsigned>(text[pos] - '0');
        ++pos;
        if (value > ZB_CPULIST_MAX_ID) {
            while (pos < text.size() && is_digit(text[pos]))
                ++pos;
            bad_list(what, text, start,
                     "CPU number " + quote_input(text.substr(start, pos - start)) +
                         " exceeds the maximum " + std::to_string(ZB_CPULIST_MAX_ID));
        }
    }
    return static_cast<unsigned>(value);
}

[[noreturn]] void bad_separator(std::string_view what, std::string_view text, size_t pos) {
    const char c = text[pos];
    if (c == ':') bad_list(what, text, pos, "strides (a-b:n) are not accepted");
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
        bad_list(what, text, pos, "whitespace is not allowed (only one trailing newline)");
    bad_list(what, text, pos,
             "expected ',' or '-' after a CPU number, found " + quote_input(text.substr(pos, 1)));
}

} // namespace

void parse_cpulist(std::string_view text, hwloc_bitmap_t out, std::string_view what) {
    std::string_view body = text;
    if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
    Bitmap set;
    size_t pos = 0;
    while (!body.empty()) {
        const size_t item = pos;
        const unsigned first = read_id(what, body, pos);
        unsigned last = first;
        if (pos < body.size() && body[pos] == '-') {
            ++pos;
            last = read_id(what, body, pos);
            if (last < first)
                bad_list(what, body, item,
                         "range " + std::to_string(first) + "-" + std::to_string(last) +
                             " is descending (write " + std::to_string(last) + "-" +
                             std::to_string(first) + ")");
        }
        if (hwloc_bitmap_set_range(set, first, last) != 0) throw std::bad_alloc();
        if (pos == body.size()) break;
        if (body[pos] != ',') bad_separator(what, body, pos);
        ++pos; // a trailing ',' makes read_id report an empty item
    }
    if (hwloc_bitmap_copy(out, set) != 0) throw std::bad_alloc();
}

std::string format_cpulist(hwloc_const_bitmap_t set) {
    if (hwloc_bitmap_weight(set) < 0) fail(ZB_EINVAL, "cannot format an infinite cpuset");
    std::string out;
    int first = hwloc_bitmap_first(set);
    while (first >= 0) {
        const int end = hwloc_bitmap_next_unset(set, first); // finite set: always found
        if (!out.empty()) out += ',';
        out += std::to_string(first);
        if (end - 1 > first) out += '-' + std::to_string(end - 1);
        first = hwloc_bitmap_next(set, end - 1);
    }
    return out;
}

} // namespace zb

extern "C" {

zb_status zb_cpulist_parse(const char *list, zb_cpuset_t *out) {
    return zb::guard([&] {
        if (!list) zb::fail(ZB_EINVAL, "zb_cpulist_parse: list is NULL");
        if (!out) zb::fail(ZB_EINVAL, "zb_cpulist_parse: out is NULL");
        zb::parse_cpulist(list, zb_cpuset_hwloc(out));
    });
}

int zb_cpulist_format(const zb_cpuset_t *set, char *buf, size_t len) {
    int result = -1;
    const zb_status status = zb::guard([&] {
        if (!set) zb::fail(ZB_EINVAL, "zb_cpulist_format: set is NULL");
        result = static_cast<int>(
            zb::copy_to_buffer(zb::format_cpulist(zb_cpuset_hwloc_const(set)), buf, len));
    });
    if (status != ZB_OK && buf && len > 0) buf[0] = '\0';
    return result;
}
}
