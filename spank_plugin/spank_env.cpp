#include "spank_env.hpp"

#include <cstring>

namespace zb::spank {
namespace {

bool holds_plan(spank_t sp) {
    char value[1];
    const spank_err_t found = spank_getenv(sp, ZB_ENV_BIND_OPTIONS, value, sizeof value);
    return found == ESPANK_SUCCESS || found == ESPANK_NOSPACE;
}

// OMP_NUM_THREADS values are a few bytes (a list of levels at most); a longer one is left alone.
struct Value {
    char text[4096] = {}; // before `found`: members start in this order
    spank_err_t found;
    Value(spank_t sp, const char *name) : found(spank_getenv(sp, name, text, sizeof text)) {}
};

} // namespace

void keep_user_threads(spank_t sp) {
    if (holds_plan(sp)) return; // the inherited plan's kUserThreadsVariable is the user's
    const Value threads(sp, "OMP_NUM_THREADS");
    if (threads.found == ESPANK_SUCCESS)
        spank_setenv(sp, kUserThreadsVariable, threads.text, 1);
    else if (threads.found == ESPANK_ENV_NOEXIST)
        spank_unsetenv(sp, kUserThreadsVariable);
}

void clear_env(spank_t sp) {
    if (holds_plan(sp)) {
        const Value user(sp, kUserThreadsVariable);
        if (user.found == ESPANK_SUCCESS)
            spank_setenv(sp, "OMP_NUM_THREADS", user.text, 1);
        else if (user.found == ESPANK_ENV_NOEXIST)
            spank_unsetenv(sp, "OMP_NUM_THREADS");
    }
    for (const char *name : kTaskVariables)
        if (std::strncmp(name, "ZENFLOW_", 8) == 0) spank_unsetenv(sp, name);
    spank_unsetenv(sp, kUserThreadsVariable);
}

void clear_inherited_plan(spank_t sp) {
    if (holds_plan(sp)) clear_env(sp);
}

} // namespace zb::spank
