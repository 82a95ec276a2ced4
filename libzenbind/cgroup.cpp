// PLACEHOLDER from the skeleton commit: replaced by the issue that implements this module.
#include "error.hpp"

extern "C" {
zb_status zb_cgroup_cpuset(const char *, pid_t, unsigned, hwloc_cpuset_t, char *, size_t) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
zb_status zb_allowed_cpus(const char *, pid_t, hwloc_cpuset_t, char *, size_t) {
    zb::set_last_error("not implemented yet");
    return ZB_EINTERNAL;
}
}
