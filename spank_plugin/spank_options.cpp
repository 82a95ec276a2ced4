#include "spank_options.hpp"

namespace zb::spank {
namespace {

std::string admin_text(const zb_options &admin) {
    const int n = zb_options_format(&admin, nullptr, 0);
    if (n < 0) return "?";
    std::string text(static_cast<size_t>(n) + 1, '\0');
    zb_options_format(&admin, text.data(), text.size());
    text.resize(static_cast<size_t>(n));
    return text;
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
        error = zb_last_error(); // names the key and quotes the value safely
        return false;
    }
    if (!admin.allow_override) {
        if (const char *key = zb_options_overridden(&admin, &out.options, user.set)) {
            const std::string k = key;
            if (k == "on" || k == "off") { // (the key of binding on or off, whichever was written)
                const char *fixed = admin.enabled ? "on" : "off";
                error = std::string("binding is fixed ") + fixed +
                        " by the administrator (override=deny): leave '" +
                        (admin.enabled ? "off" : "on") + "' out of --zenflow-bind";
            } else {
                error = "'" + k +
                        "' is fixed by the administrator (override=deny): leave it out of "
                        "--zenflow-bind, and the site's value applies (site options: " +
                        admin_text(admin) + ")";
            }
            return false;
        }
        if (admin.default_on && (user.set & ZB_SET_ENABLED) && !user.enabled) {
            error = "'off' is refused: binding is on by default and the "
                    "administrator does not allow overrides (override=deny)";
            return false;
        }
        if (admin_off && !((user.set & ZB_SET_ENABLED) && !user.enabled)) {
            error = "binding is turned off by the administrator (off, "
                    "override=deny in plugstack.conf)";
            return false;
        }
    }
    // A bare --zenflow-bind turns binding on, even where the admin wrote "off".
    out.enabled = (user.set & ZB_SET_ENABLED) ? user.enabled != 0 : true;
    out.options.enabled = out.enabled;
    return true;
}

} // namespace zb::spank
