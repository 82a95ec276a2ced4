// One field of /proc/PID/status.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace zb::util {

// Field `field` ("VmRSS", "RssAnon", ...) of process `pid` (0: this one) in bytes, from the kB the
// kernel prints; 0 when the process or the field is not there.
size_t proc_status_bytes(pid_t pid, const char *field);

// The state letter of process `pid` (0: this one), 'R', 'S', 'D', 'T' (stopped), 't' (stopped by
// a tracer), 'Z'..., from its State line; '\0' when the process is not there.
char proc_state(pid_t pid);

} // namespace zb::util
