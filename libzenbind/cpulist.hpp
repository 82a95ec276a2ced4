// The Linux cpu-list format ("0,4-11,21-26") on hwloc bitmaps, for C++ callers inside the library
// (the C entry points zb_cpulist_parse/format wrap these).
#pragma once

#include <zenbind/hwloc.h>

#include <string>
#include <string_view>

namespace zb {

// Parses `text` strictly into `out` (cleared first); throws zb::Error(ZB_EINVAL) naming the
// offending text and position. `what` names the list in the message, e.g. "cpu list" or a file.
void parse_cpulist(std::string_view text, hwloc_bitmap_t out, std::string_view what = "cpu list");

// Canonical cpu-list of a finite `set`; throws zb::Error(ZB_EINVAL) for an infinite one.
std::string format_cpulist(hwloc_const_bitmap_t set);

} // namespace zb
