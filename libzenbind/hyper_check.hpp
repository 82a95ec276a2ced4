// The check of a zb_adam_hyper that every entry point taking one makes (the worker's groups and
// steps, zb_adam_step): the values torch.optim.AdamW accepts.
#pragma once

#include "error.hpp"

#include <zenbind/worker.h>

#include <string>

namespace zb {

// Throws zb::Error(ZB_EINVAL) naming `where` and the first value out of range.
void check_hyper(const zb_adam_hyper &h, const std::string &where);

} // namespace zb
