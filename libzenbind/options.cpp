// PLACEHOLDER from the skeleton commit: replaced by the issue that implements this module.
#include "error.hpp"

extern "C" {
void zb_options_init(zb_options *) {  }
zb_status zb_options_parse(zb_options *, const char *, zb_scope) { zb::set_last_error("not implemented yet"); return ZB_EINTERNAL; }
int zb_options_format(const zb_options *, char *, size_t) { return -1; }
}
