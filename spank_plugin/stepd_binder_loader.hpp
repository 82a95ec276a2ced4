// Finds and loads zenflow_bind_binder.so (stepd_binder.h) the first time a step binds.
#pragma once

#include "stepd_binder.h"

#include <string>

namespace zb::spank {

// The binder beside this plugin (the build tree, or a site that installs both in one directory),
// else the one installed in ZB_BINDER_DIR; nullptr with `error` set if neither loads. Never from a
// path in the environment: this runs in root's slurmstepd.
const zb_binder *load_binder(std::string &error);

} // namespace zb::spank
