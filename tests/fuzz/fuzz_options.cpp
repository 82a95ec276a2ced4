// zb_options_parse on arbitrary text, in both scopes, onto a struct that already holds values:
// a failure leaves the struct unchanged and a message; a success formats to a canonical text
// that parses back to the same fields; the user scope never changes an admin field.
#include "check.hpp"

#include <zenbind/zenbind.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace {

bool same_fields(const zb_options &a, const zb_options &b) {
    return a.enabled == b.enabled && a.train_cores == b.train_cores &&
           a.train_fraction == b.train_fraction && a.opt_cores == b.opt_cores && a.smt == b.smt &&
           a.numa == b.numa && a.verbose == b.verbose && a.batch == b.batch &&
           std::strcmp(a.profile, b.profile) == 0 && a.default_on == b.default_on &&
           a.allow_override == b.allow_override && a.fail_on_error == b.fail_on_error;
}

std::string format(const zb_options &o) {
    const int n = zb_options_format(&o, nullptr, 0);
    ZB_FUZZ_CHECK(n >= 0);
    std::string text(static_cast<size_t>(n) + 1, '\0');
    ZB_FUZZ_CHECK(zb_options_format(&o, text.data(), text.size()) == n);
    text.resize(static_cast<size_t>(n));
    return text;
}

void check_scope(const std::string &text, zb_scope scope) {
    zb_options base;
    zb_options_init(&base);
    ZB_FUZZ_CHECK(zb_options_parse(&base, "train=3,opt=2,smt=opt,profile=/p,onerror=fail",
                                   ZB_SCOPE_ADMIN) == ZB_OK);
    zb_options o = base;
    if (zb_options_parse(&o, text.c_str(), scope) != ZB_OK) {
        ZB_FUZZ_CHECK(std::memcmp(&o, &base, sizeof o) == 0);
        ZB_FUZZ_CHECK(zb_last_error()[0] != '\0');
        ZB_FUZZ_CHECK(std::strlen(zb_last_error()) < 1024);
        return;
    }
    ZB_FUZZ_CHECK((o.set & base.set) == base.set);
    ZB_FUZZ_CHECK(o.size == base.size); // a parse never changes the caller's size
    if (scope == ZB_SCOPE_USER)
        ZB_FUZZ_CHECK(o.default_on == base.default_on && o.allow_override == base.allow_override &&
                      o.fail_on_error == base.fail_on_error);
    ZB_FUZZ_CHECK(o.train_cores == 0 || o.train_fraction == 0);
    ZB_FUZZ_CHECK(o.train_fraction == 0 || (o.train_fraction > 0 && o.train_fraction < 1));

    const std::string canonical = format(o);
    zb_options back;
    zb_options_init(&back);
    ZB_FUZZ_CHECK(zb_options_parse(&back, canonical.c_str(), ZB_SCOPE_ADMIN) == ZB_OK);
    ZB_FUZZ_CHECK(same_fields(o, back));
    ZB_FUZZ_CHECK(format(back) == canonical);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    check_scope(text, ZB_SCOPE_USER);
    check_scope(text, ZB_SCOPE_ADMIN);
    return 0;
}
