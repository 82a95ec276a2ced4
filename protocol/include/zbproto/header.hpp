// The control block's header: what the trainer writes first, and the worker's check of it. Both
// sides check: the worker every size (accept_header), the trainer the worker_version the worker
// announces before checking, so that either side refuses a peer of another layout.
#pragma once

#include "layout.hpp"

#include <cstddef>
#include <string>

namespace zb::proto {

Header make_header();

// Announces this build's version in h.worker_version, then checks the header of a control block
// of `mapped` bytes. Returns why it is refused, or "" if it is one of this build's layout.
std::string accept_header(Header &h, size_t mapped);

} // namespace zb::proto
