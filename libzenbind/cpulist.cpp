// PLACEHOLDER from the skeleton commit: replaced by the issue that implements this module.
#include "error.hpp"

extern "C" {
zb_status zb_cpulist_parse(const char *, hwloc_bitmap_t) { zb::set_last_error("not implemented yet"); return ZB_EINTERNAL; }
int zb_cpulist_format(hwloc_const_bitmap_t, char *, size_t) { return -1; }
}
