#include "policy.hpp"

#include <cstring>

namespace zbspank {
namespace {

std::string admin_text(const zb_options &admin) {
    char buf[512];
    const int n = zb_options_format(&admin, buf, sizeof buf);
    if (n < 0) return "?";
    return buf;
}

// The user key under `bit` that sets a value different from the admin's, or nullptr.
const char *changed_key(unsigned bit, const zb_options &admin, const zb_options &merged) {
    switch (bit) {
    case ZB_SET_ENABLED:
        return admin.enabled != merged.enabled ? "on/off" : nullptr;
    case ZB_SET_TRAIN:
        return admin.train_cores != merged.train_cores ||
                       admin.train_fraction != merged.train_fraction
                   ? "train"
                   : nullptr;
    case ZB_SET_OPT:
        return admin.opt_cores != merged.opt_cores ? "opt" : nullptr;
    case ZB_SET_SMT:
        return admin.smt != merged.smt ? "smt" : nullptr;
    case ZB_SET_NUMA:
        return admin.numa != merged.numa ? "numa" : nullptr;
    case ZB_SET_PROFILE:
        return std::strcmp(admin.profile, merged.profile) ? "profile" : nullptr;
    case ZB_SET_VERBOSE:
        return admin.verbose != merged.verbose ? "verbose" : nullptr;
    case ZB_SET_BATCH:
        return admin.batch != merged.batch ? "batch" : nullptr;
    default:
        return nullptr;
    }
}

} // namespace

bool parse_admin(int argc, char **argv, zb_options &admin, std::string &error) {
    zb_options_init(&admin);
    for (int i = 0; i < argc; ++i) {
        if (zb_options_parse(&admin, argv[i], ZB_SCOPE_ADMIN) != ZB_OK) {
            error = std::string("plugstack.conf argument '") + argv[i] + "': " + zb_last_error();
            return false;
        }
    }
    return true;
}

bool resolve(const zb_options &admin, const char *user_text, Resolved &out, std::string &error) {
    out.options = admin;
    const bool admin_off = (admin.set & ZB_SET_ENABLED) && !admin.enabled;
    if (!user_text) {
        out.enabled = admin.default_on && !admin_off;
        out.options.enabled = out.enabled;
        return true;
    }
    // Parsed alone first, to learn which keys the user wrote.
    zb_options user;
    zb_options_init(&user);
    if (zb_options_parse(&user, user_text, ZB_SCOPE_USER) != ZB_OK ||
        zb_options_parse(&out.options, user_text, ZB_SCOPE_USER) != ZB_OK) {
        error = std::string("--zenflow-bind: ") + zb_last_error();
        return false;
    }
    if (!admin.allow_override) {
        for (unsigned bit = 1; bit <= ZB_SET_BATCH; bit <<= 1) {
            if (!(user.set & bit) || !(admin.set & bit)) continue;
            if (const char *key = changed_key(bit, admin, out.options)) {
                error = std::string("--zenflow-bind: '") + key +
                        "' is fixed by the administrator (override=deny; site options: " +
                        admin_text(admin) + ")";
                return false;
            }
        }
        if (admin.default_on && (user.set & ZB_SET_ENABLED) && !user.enabled) {
            error = "--zenflow-bind: 'off' is refused: binding is on by default and the "
                    "administrator does not allow overrides (override=deny)";
            return false;
        }
        if (admin_off && !((user.set & ZB_SET_ENABLED) && !user.enabled)) {
            error = "--zenflow-bind: binding is turned off by the administrator (off, "
                    "override=deny in plugstack.conf)";
            return false;
        }
    }
    // A bare --zenflow-bind turns binding on, even where the admin wrote "off".
    out.enabled = (user.set & ZB_SET_ENABLED) ? user.enabled != 0 : true;
    out.options.enabled = out.enabled;
    return true;
}

} // namespace zbspank
