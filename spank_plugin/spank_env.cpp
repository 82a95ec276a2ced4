#include "spank_env.hpp"

#include <cstring>

namespace zb::spank {

void clear_env(spank_t sp) {
    for (const char *name : kTaskVariables)
        if (std::strncmp(name, "ZENFLOW_", 8) == 0) spank_unsetenv(sp, name);
}

} // namespace zb::spank
