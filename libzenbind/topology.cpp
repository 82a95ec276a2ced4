// PLACEHOLDER from the skeleton commit: replaced by the issue that implements this module.
#include "error.hpp"

extern "C" {
zb_status zb_topology_load(zb_topology_t **) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
zb_status zb_topology_load_xml(const char *, zb_topology_t **) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
zb_status zb_topology_load_synthetic(const char *, zb_topology_t **) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
void zb_topology_free(zb_topology_t *) {}
hwloc_topology_t zb_topology_hwloc(const zb_topology_t *) {
    return nullptr;
}
hwloc_const_cpuset_t zb_topology_cpuset(const zb_topology_t *) {
    return nullptr;
}
}
