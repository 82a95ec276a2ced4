// zbutil (util/): plain decimal numbers, the bounds they are read within, and /proc/PID/status.
#include <zbutil/decimal.hpp>
#include <zbutil/proc_status.hpp>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <setjmp.h>
#include <string>
#include <unistd.h>
#include <vector>

extern "C" {
#include <cmocka.h>
}

namespace {

using zb::util::is_decimal;
using zb::util::parse_decimal;

void decimal_text_only(void **) {
    for (const char *ok : {"0", "7", "0042", "18446744073709551615"})
        assert_true(is_decimal(ok));
    for (const char *bad : {"", " 1", "1 ", "+1", "-1", "0x10", "1e3", "1.0", "1,2", "٣"})
        assert_false(is_decimal(bad));
    assert_false(parse_decimal("", 10).has_value());
    assert_false(parse_decimal("-0", 10).has_value());
    assert_int_equal(*parse_decimal("0042", 100), 42);
}

void bounds_hold_without_overflow(void **) {
    assert_int_equal(*parse_decimal("65536", 65536), 65536);
    assert_false(parse_decimal("65537", 65536).has_value());
    assert_int_equal(*parse_decimal("0", 0), 0);
    assert_false(parse_decimal("1", 0).has_value());
    assert_false(parse_decimal("3", 2).has_value()); // one digit above a one-digit bound
    assert_false(parse_decimal("09", 8).has_value());
    // the largest value there is, and one past it, which would wrap to 0 in 64-bit arithmetic
    assert_true(*parse_decimal("18446744073709551615", UINT64_MAX) == UINT64_MAX);
    assert_false(parse_decimal("18446744073709551616", UINT64_MAX).has_value());
    // many digits: refused once past max, never wrapped into range
    assert_false(parse_decimal(std::string(400, '9'), UINT64_MAX).has_value());
    assert_false(parse_decimal("36893488147419103232", 100).has_value()); // 2^65
    assert_int_equal(*parse_decimal(std::string(400, '0') + "5", 9), 5);
}

void status_fields_in_bytes(void **) {
    std::vector<char> touched(64 << 20, 1); // 64 MiB resident
    const size_t rss = zb::util::proc_status_bytes(0, "VmRSS");
    assert_true(rss >= touched.size());
    assert_true(rss % 1024 == 0);
    assert_int_equal(zb::util::proc_status_bytes(getpid(), "VmRSS") >= touched.size(), 1);
    assert_int_equal(zb::util::proc_status_bytes(0, "NoSuchField"), 0);
    assert_int_equal(zb::util::proc_status_bytes(0, "VmRS"), 0); // a prefix is not the field
    assert_int_equal(zb::util::proc_status_bytes(999999999, "VmRSS"), 0);
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decimal_text_only),
        cmocka_unit_test(bounds_hold_without_overflow),
        cmocka_unit_test(status_fields_in_bytes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
