#include "spank_env.hpp"

#include <cstring>
#include <optional>
#include <string>

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

// The user's OMP_NUM_THREADS kept beside a plan the plugin made ("": none), where OMP_NUM_THREADS
// still holds that plan's count (no one changed it since); nullopt otherwise.
std::optional<std::string> kept_user_threads(spank_t sp) {
    const Value threads(sp, "OMP_NUM_THREADS");
    if (!holds_plan(sp) || threads.found != ESPANK_SUCCESS) return std::nullopt;
    const Value plan(sp, ZB_ENV_TRAIN_THREADS), user(sp, kUserThreadsVariable);
    if (plan.found != ESPANK_SUCCESS || user.found != ESPANK_SUCCESS ||
        std::strcmp(plan.text, threads.text) != 0)
        return std::nullopt;
    return std::string(user.text);
}

} // namespace

void keep_user_threads(spank_t sp) {
    if (kept_user_threads(sp)) return; // the user's is kept already
    const Value threads(sp, "OMP_NUM_THREADS");
    if (threads.found == ESPANK_SUCCESS)
        spank_setenv(sp, kUserThreadsVariable, threads.text, 1);
    else if (threads.found == ESPANK_ENV_NOEXIST)
        spank_setenv(sp, kUserThreadsVariable, "", 1); // none
}

void clear_env(spank_t sp) {
    if (const std::optional<std::string> user = kept_user_threads(sp)) {
        if (user->empty())
            spank_unsetenv(sp, "OMP_NUM_THREADS");
        else
            spank_setenv(sp, "OMP_NUM_THREADS", user->c_str(), 1);
    }
    for (const char *name : kTaskVariables)
        if (std::strncmp(name, "ZENFLOW_", 8) == 0) spank_unsetenv(sp, name);
    spank_unsetenv(sp, kUserThreadsVariable);
}

void clear_inherited_plan(spank_t sp) {
    if (holds_plan(sp)) clear_env(sp);
}

} // namespace zb::spank
