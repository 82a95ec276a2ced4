// The plugin's admin/user policy (spank_plugin/spank_options.cpp) over the real options parser:
// what a step runs with, and which user values override=deny refuses. No Slurm needed.
#include "spank_options.hpp"

#include <cstdarg>
#include <cstddef>
#include <cstring>
#include <setjmp.h>
#include <string>
#include <vector>

extern "C" {
#include <cmocka.h>
}

namespace {

zb_options admin_from(std::initializer_list<const char *> args) {
    zb_options admin;
    std::string error;
    std::vector<char *> argv;
    for (const char *a : args)
        argv.push_back(const_cast<char *>(a));
    assert_true(zb::spank::parse_admin(static_cast<int>(argv.size()), argv.data(), admin, error));
    return admin;
}

bool refuses(const zb_options &admin, const char *user, const char *needle) {
    zb::spank::Resolved r;
    std::string error;
    if (zb::spank::resolve(admin, user, r, error)) return false;
    return error.find(needle) != std::string::npos;
}

void without_option_binds_only_when_default_on(void **) {
    zb::spank::Resolved r;
    std::string error;
    assert_true(zb::spank::resolve(admin_from({}), nullptr, r, error));
    assert_false(r.enabled);
    assert_true(zb::spank::resolve(admin_from({"default=on", "opt=2"}), nullptr, r, error));
    assert_true(r.enabled);
    assert_int_equal(r.options.opt_cores, 2);
    assert_true(zb::spank::resolve(admin_from({"default=on,off"}), nullptr, r, error));
    assert_false(r.enabled);
}

void bare_option_turns_binding_on_with_admin_values(void **) {
    zb::spank::Resolved r;
    std::string error;
    assert_true(zb::spank::resolve(admin_from({"opt=3", "verbose"}), "", r, error));
    assert_true(r.enabled);
    assert_int_equal(r.options.opt_cores, 3);
    assert_true(r.options.verbose);
    assert_true(zb::spank::resolve(admin_from({"default=on"}), "off", r, error));
    assert_false(r.enabled);
}

void user_values_win_under_override_allow(void **) {
    zb::spank::Resolved r;
    std::string error;
    assert_true(zb::spank::resolve(admin_from({"opt=1"}), "opt=2,train=3", r, error));
    assert_int_equal(r.options.opt_cores, 2);
    assert_int_equal(r.options.train_cores, 3);
}

void override_deny_refuses_changes_to_admin_keys_only(void **) {
    const zb_options admin = admin_from({"default=on,override=deny", "opt=1"});
    assert_true(refuses(admin, "opt=2", "'opt' is fixed by the administrator"));
    assert_true(refuses(admin, "opt=2", "override=deny"));
    assert_true(refuses(admin, "off", "'off' is refused: binding is on by default"));
    zb::spank::Resolved r;
    std::string error;
    assert_true(zb::spank::resolve(admin, "opt=1,train=1,verbose", r, error)); // restated + open
    assert_int_equal(r.options.train_cores, 1);
    assert_true(
        refuses(admin_from({"off", "override=deny"}), "", "turned off by the administrator"));
    // each refusal says what to do; "on" written by the administrator is not the user's "off"
    assert_true(refuses(admin, "opt=2", "leave it out of --zenflow-bind"));
    assert_true(refuses(admin_from({"on,override=deny"}), "off",
                        "binding is fixed on by the administrator (override=deny): leave 'off' "
                        "out"));
}

void bad_user_values_name_the_key(void **) {
    const zb_options admin = admin_from({});
    assert_true(refuses(admin, "bogus=1", "unknown key 'bogus'"));
    assert_true(refuses(admin, "opt=0", "bad value '0' for opt="));
    assert_true(
        refuses(admin, "default=on", "key 'default' is admin-only")); // admin key from a user
}

void bad_admin_argument_names_argument_and_key(void **) {
    zb_options admin;
    std::string error;
    char good[] = "default=on", bad[] = "frobnicate=1";
    char *argv[] = {good, bad};
    assert_false(zb::spank::parse_admin(2, argv, admin, error));
    assert_non_null(std::strstr(error.c_str(), "frobnicate"));
    assert_non_null(std::strstr(error.c_str(), "plugstack.conf"));
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(without_option_binds_only_when_default_on),
        cmocka_unit_test(bare_option_turns_binding_on_with_admin_values),
        cmocka_unit_test(user_values_win_under_override_allow),
        cmocka_unit_test(override_deny_refuses_changes_to_admin_keys_only),
        cmocka_unit_test(bad_user_values_name_the_key),
        cmocka_unit_test(bad_admin_argument_names_argument_and_key),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
