// Bounded reads of small text files (cgroup and /proc files, tuning profiles).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace zb {

// The contents of `path`, or nothing when it (or a directory on its path) does not exist. Fails
// (zb::fail, naming the file) on any other error, for more than `limit` bytes, and for anything
// but a regular file: it is opened without blocking, so a FIFO or device named by a user cannot
// block the caller (slurmstepd reads the profile a user names).
std::optional<std::string> read_text_file(const std::string &path, size_t limit);

// The same for a file that must exist: a missing one fails like any other error (ZB_ESYS).
std::string require_text_file(const std::string &path, size_t limit);

} // namespace zb
