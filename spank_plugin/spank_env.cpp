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

// Whether the environment holds a plan the plugin made, with the user's OMP_NUM_THREADS kept
// beside it, and OMP_NUM_THREADS still what the plan set (no one changed it since).
bool plan_threads_in_place(spank_t sp, const Value &threads) {
    if (!holds_plan(sp) || threads.found != ESPANK_SUCCESS) return false;
    const Value plan(sp, ZB_ENV_TRAIN_THREADS), user(sp, kUserThreadsVariable);
    return plan.found == ESPANK_SUCCESS && user.found == ESPANK_SUCCESS &&
           std::strcmp(plan.text, threads.text) == 0;
}

} // namespace

void keep_user_threads(spank_t sp) {
    const Value threads(sp, "OMP_NUM_THREADS");
    if (plan_threads_in_place(sp, threads)) return; // the user's is kept already
    if (threads.found == ESPANK_SUCCESS)
        spank_setenv(sp, kUserThreadsVariable, threads.text, 1);
    else if (threads.found == ESPANK_ENV_NOEXIST)
        spank_setenv(sp, kUserThreadsVariable, "", 1); // none
}

void clear_env(spank_t sp) {
    const Value threads(sp, "OMP_NUM_THREADS");
    if (plan_threads_in_place(sp, threads)) {
        const Value user(sp, kUserThreadsVariable);
        if (*user.text)
            spank_setenv(sp, "OMP_NUM_THREADS", user.text, 1);
        else
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
