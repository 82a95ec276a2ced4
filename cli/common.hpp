// Shared pieces of the zenbind subcommands: errors, cpu lists as text, JSON strings, topology.
#pragma once

#include <zbutil/cpulist_text.hpp>
#include <zenbind/zenbind.h>

#include <string>

namespace zb::cli {

// Exit statuses of every subcommand.
inline constexpr int kOk = 0, kRuntime = 1, kUsage = 2;

// "zenbind: <message>" on stderr; returns `status` so callers can `return error(...)`.
int error(int status, const std::string &message);
// The same with zb_last_error() appended after ": ".
int zb_error(int status, const std::string &what);

using util::cpulist;
std::string json_string(const std::string &text);

// The CPUs this process may use (zb_allowed_cpus: its cgroup cpuset and affinity), into `out` and
// their source into `source`; kOk, or the exit status of the error it printed. Refused while
// OpenMP binds threads (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set): libgomp then pins
// this process to its first place before main(), and the machine would read as that place.
int this_process_cpus(zb_cpuset_t *out, char *source, size_t source_len);

// Reads the value of flag argv[i] into `value`, advancing i; false if it is missing.
bool take_value(int argc, char **argv, int &i, std::string &value);

} // namespace zb::cli
