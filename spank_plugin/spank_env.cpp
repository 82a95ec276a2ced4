#include "spank_env.hpp"

#include <cstring>

namespace zb::spank {

void clear_env(spank_t sp) {
    for (const char *name : kTaskVariables)
        if (std::strncmp(name, "ZENFLOW_", 8) == 0) spank_unsetenv(sp, name);
}

void clear_inherited_plan(spank_t sp) {
    char value[1];
    const spank_err_t found = spank_getenv(sp, ZB_ENV_BIND_OPTIONS, value, sizeof value);
    if (found == ESPANK_SUCCESS || found == ESPANK_NOSPACE) clear_env(sp);
}

} // namespace zb::spank
