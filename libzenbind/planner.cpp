// PLACEHOLDER from the skeleton commit: replaced by the issue that implements this module.
#include "error.hpp"

extern "C" {
zb_status zb_plan_compute(const zb_topology_t *, hwloc_const_cpuset_t, unsigned, const zb_options *,
                          zb_plan_t **) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
void zb_plan_free(zb_plan_t *) {}
unsigned zb_plan_ntasks(const zb_plan_t *) {
    return 0;
}
zb_status zb_plan_task(const zb_plan_t *, unsigned, zb_task_plan *) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
unsigned zb_plan_nwarnings(const zb_plan_t *) {
    return 0;
}
const char *zb_plan_warning(const zb_plan_t *, unsigned) {
    return nullptr;
}
}
