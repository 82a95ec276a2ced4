/* zb_cpulist_parse / zb_cpulist_format: the Linux cpu-list format on zb_cpuset_t sets, and the
 * zb_cpuset_* calls that read those sets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

/* A new set holding `list`, which must parse. */
static zb_cpuset_t *parsed(const char *list) {
    zb_cpuset_t *set = zb_cpuset_alloc();
    assert_non_null(set);
    zb_status st = zb_cpulist_parse(list, set);
    if (st != ZB_OK) fail_msg("parse '%s' failed: %s", list, zb_last_error());
    return set;
}

/* Parses `list`, which must succeed, and returns its canonical form (static buffer). */
static const char *canonical(const char *list) {
    static char buf[1 << 20];
    zb_cpuset_t *set = parsed(list);
    int n = zb_cpulist_format(set, buf, sizeof buf);
    assert_int_equal(n, (int)strlen(buf));
    zb_cpuset_free(set);
    return buf;
}

/* Parses `list`, which must fail with ZB_EINVAL, and returns the message. */
static const char *rejected(const char *list) {
    zb_cpuset_t *set = parsed("7");
    zb_status st = zb_cpulist_parse(list, set);
    if (st != ZB_EINVAL) fail_msg("parse '%s' gave %s, expected EINVAL", list, zb_status_name(st));
    /* a failed parse leaves the output as it was */
    assert_int_equal(zb_cpuset_weight(set), 1);
    assert_true(zb_cpuset_isset(set, 7));
    zb_cpuset_free(set);
    assert_true(strlen(zb_last_error()) > 0);
    return zb_last_error();
}

static void test_seed_masks(void **state) {
    (void)state;
    zb_cpuset_t *set = parsed("0,4-11,21-26,30-46");
    assert_int_equal(zb_cpuset_weight(set), 1 + 8 + 6 + 17);
    assert_true(zb_cpuset_isset(set, 0));
    assert_false(zb_cpuset_isset(set, 1));
    assert_false(zb_cpuset_isset(set, 3));
    assert_true(zb_cpuset_isset(set, 4));
    assert_true(zb_cpuset_isset(set, 11));
    assert_false(zb_cpuset_isset(set, 12));
    assert_true(zb_cpuset_isset(set, 46));
    assert_false(zb_cpuset_isset(set, 47));
    assert_int_equal(zb_cpuset_next(set, 46), -1); /* 46 is the last */
    zb_cpuset_free(set);

    assert_string_equal(canonical("0,4-11,21-26,30-46"), "0,4-11,21-26,30-46");
    assert_string_equal(canonical("64,97-127"), "64,97-127");
    assert_string_equal(canonical("0-15,32-47"), "0-15,32-47");
}

static void test_empty_and_newline(void **state) {
    (void)state;
    zb_cpuset_t *set = parsed("3");
    assert_int_equal(zb_cpulist_parse("", set), ZB_OK);
    assert_int_equal(zb_cpuset_weight(set), 0); /* cleared first */
    assert_int_equal(zb_cpulist_parse("3", set), ZB_OK);
    assert_int_equal(zb_cpulist_parse("\n", set), ZB_OK); /* an empty sysfs/cgroup file */
    assert_int_equal(zb_cpuset_weight(set), 0);
    assert_int_equal(zb_cpulist_parse("0-63\n", set), ZB_OK);
    assert_int_equal(zb_cpuset_weight(set), 64);
    zb_cpuset_free(set);
    assert_string_equal(canonical(""), "");
}

static void test_canonical_form(void **state) {
    (void)state;
    assert_string_equal(canonical("0"), "0");
    assert_string_equal(canonical("0,1"), "0-1"); /* as the kernel prints a run of two */
    assert_string_equal(canonical("0,1,2,5"), "0-2,5");
    assert_string_equal(canonical("3-3"), "3");
    assert_string_equal(canonical("8-15,0-7,3"), "0-15"); /* order and overlap do not matter */
    assert_string_equal(canonical("007,010"), "7,10");    /* decimal, even with leading zeros */
    assert_string_equal(canonical("65535"), "65535");
    assert_string_equal(canonical("0-65535"), "0-65535");
    assert_string_equal(canonical("1,3,5"), "1,3,5");
}

static void test_rejects(void **state) {
    (void)state;
    const char *bad[] = {"0-63:2", " 0",      "0 ",           "0, 1",
                         "0\n\n",  "\n0",     "0,,1",         "0,",
                         ",0",     "-1",      "1-",           "5-3",
                         "0x10",   "a",       "1-2-3",        "+1",
                         "65536",  "0-65536", "0-4000000000", "99999999999999999999999999",
                         "0\r\n",  "0\t1",    "1;2",          "ä"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        rejected(bad[i]);
}

static void test_messages(void **state) {
    (void)state;
    /* what a user sees for each kind of mistake */
    static const struct {
        const char *list, *message;
    } cases[] = {
        {"0,4-x", "invalid cpu list '0,4-x' at character 5: expected a CPU number, found 'x'"},
        {"0,11-4", "invalid cpu list '0,11-4' at character 3: range 11-4 is descending "
                   "(write 4-11)"},
        {"0-63:2", "invalid cpu list '0-63:2' at character 5: strides (a-b:n) are not accepted"},
        {"0,,1", "invalid cpu list '0,,1' at character 3: expected a CPU number, found an empty "
                 "item"},
        {"0,", "invalid cpu list '0,' at character 3: expected a CPU number, found an empty item"},
        {"1-70000", "invalid cpu list '1-70000' at character 3: CPU number '70000' exceeds the "
                    "maximum 65535"},
        {"0, 1", "invalid cpu list '0, 1' at character 3: expected a CPU number, found whitespace "
                 "(not allowed)"},
        {"0 1", "invalid cpu list '0 1' at character 2: whitespace is not allowed (only one "
                "trailing newline)"},
        {"3x", "invalid cpu list '3x' at character 2: expected ',' or '-' after a CPU number, "
               "found 'x'"},
        /* control bytes are escaped, so a message never carries raw terminal input */
        {"1\x1b", "invalid cpu list '1\\x1b' at character 2: expected ',' or '-' after a CPU "
                  "number, found '\\x1b'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        assert_string_equal(rejected(cases[i].list), cases[i].message);
}

static void test_long_input_message_is_bounded(void **state) {
    (void)state;
    size_t n = 20000;
    char *list = malloc(n + 1);
    assert_non_null(list);
    size_t len = 0;
    for (int cpu = 0; len < n - 10; cpu += 2)
        len += (size_t)sprintf(list + len, "%d,", cpu);
    strcpy(list + len, "z");
    const char *msg = rejected(list);
    assert_true(strlen(msg) < 300);
    assert_non_null(strstr(msg, "...")); /* an excerpt... */
    assert_non_null(strstr(msg, ",z'")); /* ...around the error, which is at the end */
    char where[64];
    snprintf(where, sizeof where, "at character %zu:", len + 1);
    assert_non_null(strstr(msg, where));
    free(list);
}

static void test_format_snprintf_semantics(void **state) {
    (void)state;
    zb_cpuset_t *set = parsed("0,4-11,21-26");
    const int full = (int)strlen("0,4-11,21-26");
    assert_int_equal(zb_cpulist_format(set, NULL, 0), full);
    char buf[8];
    memset(buf, 'X', sizeof buf);
    assert_int_equal(zb_cpulist_format(set, buf, sizeof buf), full);
    assert_string_equal(buf, "0,4-11,");
    assert_int_equal(zb_cpulist_format(set, buf, 1), full);
    assert_string_equal(buf, "");
    char exact[13];
    assert_int_equal(zb_cpulist_format(set, exact, sizeof exact), full);
    assert_string_equal(exact, "0,4-11,21-26");

    /* a zb_cpuset_t is an hwloc bitmap: hwloc fills it in place */
    hwloc_bitmap_fill(zb_cpuset_hwloc(set)); /* infinite */
    memset(buf, 'X', sizeof buf);
    assert_int_equal(zb_cpulist_format(set, buf, sizeof buf), -1);
    assert_string_equal(buf, "");
    hwloc_bitmap_zero(zb_cpuset_hwloc(set));
    hwloc_bitmap_set_range(zb_cpuset_hwloc(set), 5, -1); /* infinite from 5 on */
    assert_int_equal(zb_cpulist_format(set, buf, sizeof buf), -1);
    assert_int_equal(zb_cpulist_format(NULL, buf, sizeof buf), -1);
    zb_cpuset_free(set);
}

static void test_null_arguments(void **state) {
    (void)state;
    zb_cpuset_t *set = zb_cpuset_alloc();
    assert_int_equal(zb_cpulist_parse(NULL, set), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "NULL"));
    assert_int_equal(zb_cpulist_parse("0", NULL), ZB_EINVAL);
    zb_cpuset_free(set);
}

/* Random finite sets survive format -> parse unchanged, and the text is the canonical one. */
static void test_random_round_trip(void **state) {
    (void)state;
    unsigned seed = 12345;
    zb_cpuset_t *set = zb_cpuset_alloc(), *back = zb_cpuset_alloc();
    char buf[4096], again[4096];
    for (int round = 0; round < 500; ++round) {
        hwloc_bitmap_zero(zb_cpuset_hwloc(set));
        const int span = 1 + rand_r(&seed) % 300;
        const int density = 1 + rand_r(&seed) % 100;
        for (int cpu = 0; cpu < span; ++cpu)
            if (rand_r(&seed) % 100 < density)
                hwloc_bitmap_set(zb_cpuset_hwloc(set), (unsigned)cpu);
        const int n = zb_cpulist_format(set, buf, sizeof buf);
        assert_true(n >= 0 && n < (int)sizeof buf);
        assert_int_equal(zb_cpulist_parse(buf, back), ZB_OK);
        assert_true(zb_cpuset_isequal(set, back));
        assert_int_equal(zb_cpulist_format(back, again, sizeof again), n);
        assert_string_equal(buf, again);
    }
    zb_cpuset_free(set);
    zb_cpuset_free(back);
}

/* The numbers of `set` in the order zb_cpuset_next gives them, as "a b c" (static buffer). */
static const char *walked(const zb_cpuset_t *set) {
    static char buf[512];
    size_t len = 0;
    buf[0] = '\0';
    for (int id = zb_cpuset_next(set, -1); id >= 0; id = zb_cpuset_next(set, id))
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%d", len ? " " : "", id);
    return buf;
}

/* zb_cpuset_alloc / weight / isset / next / isequal on sets from lists. */
static void test_cpuset_calls(void **state) {
    (void)state;
    zb_cpuset_t *empty = zb_cpuset_alloc();
    assert_non_null(empty);
    assert_int_equal(zb_cpuset_weight(empty), 0);
    assert_false(zb_cpuset_isset(empty, 0));
    assert_int_equal(zb_cpuset_next(empty, -1), -1);
    assert_string_equal(walked(empty), "");

    zb_cpuset_t *set = parsed("0,4-6,63-64,65535");
    assert_int_equal(zb_cpuset_weight(set), 1 + 3 + 2 + 1);
    assert_string_equal(walked(set), "0 4 5 6 63 64 65535");
    /* next: the smallest above prev, whether prev is in the set or not */
    assert_int_equal(zb_cpuset_next(set, -1), 0);
    assert_int_equal(zb_cpuset_next(set, 0), 4);
    assert_int_equal(zb_cpuset_next(set, 2), 4);
    assert_int_equal(zb_cpuset_next(set, 6), 63);
    assert_int_equal(zb_cpuset_next(set, 64), 65535);
    assert_int_equal(zb_cpuset_next(set, 65535), -1);
    assert_int_equal(zb_cpuset_isset(set, 5), 1);
    assert_int_equal(zb_cpuset_isset(set, 7), 0);
    assert_int_equal(zb_cpuset_isset(set, 65535), 1);
    assert_int_equal(zb_cpuset_isset(set, 100000), 0);

    /* equality is of the numbers, not of the text they came from */
    zb_cpuset_t *same = parsed("65535,63,64,4-6,0"), *fewer = parsed("0,4-6,63-64");
    assert_int_equal(zb_cpuset_isequal(set, same), 1);
    assert_int_equal(zb_cpuset_isequal(same, set), 1);
    assert_int_equal(zb_cpuset_isequal(set, set), 1);
    assert_int_equal(zb_cpuset_isequal(set, fewer), 0);
    assert_int_equal(zb_cpuset_isequal(fewer, set), 0);
    assert_int_equal(zb_cpuset_isequal(empty, fewer), 0);
    zb_cpuset_t *also_empty = parsed("");
    assert_int_equal(zb_cpuset_isequal(empty, also_empty), 1);

    zb_cpuset_free(also_empty);
    zb_cpuset_free(fewer);
    zb_cpuset_free(same);
    zb_cpuset_free(set);
    zb_cpuset_free(empty);
}

/* <zenbind/hwloc.h>: an hwloc bitmap is a zb_cpuset_t and back, without a copy; hwloc's full
 * (infinite) set weighs -1. */
static void test_cpuset_is_an_hwloc_bitmap(void **state) {
    (void)state;
    hwloc_bitmap_t h = hwloc_bitmap_alloc();
    hwloc_bitmap_set_range(h, 2, 5);
    hwloc_bitmap_set(h, 9);
    const zb_cpuset_t *as_zb = zb_cpuset_from_hwloc(h);
    assert_ptr_equal(zb_cpuset_hwloc_const(as_zb), h);
    assert_int_equal(zb_cpuset_weight(as_zb), 5);
    assert_string_equal(walked(as_zb), "2 3 4 5 9");
    assert_true(zb_cpuset_isequal(as_zb, zb_cpuset_from_hwloc_const(h)));

    hwloc_bitmap_fill(h);
    assert_int_equal(zb_cpuset_weight(zb_cpuset_from_hwloc(h)), -1);
    assert_true(zb_cpuset_isset(zb_cpuset_from_hwloc(h), 123456));
    assert_int_equal(zb_cpuset_next(zb_cpuset_from_hwloc(h), 41), 42);
    zb_cpuset_t *from5 = zb_cpuset_alloc();
    hwloc_bitmap_set_range(zb_cpuset_hwloc(from5), 5, -1);
    assert_int_equal(zb_cpuset_weight(from5), -1);
    assert_int_equal(zb_cpuset_next(from5, -1), 5);
    assert_false(zb_cpuset_isequal(zb_cpuset_from_hwloc(h), from5));

    /* a zb_cpulist_parse into an hwloc bitmap is seen by hwloc */
    assert_int_equal(zb_cpulist_parse("1,3", zb_cpuset_from_hwloc(h)), ZB_OK);
    assert_int_equal(hwloc_bitmap_weight(h), 2);
    assert_int_equal(hwloc_bitmap_first(h), 1);
    zb_cpuset_free(from5);
    hwloc_bitmap_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_masks),
        cmocka_unit_test(test_empty_and_newline),
        cmocka_unit_test(test_canonical_form),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_long_input_message_is_bounded),
        cmocka_unit_test(test_format_snprintf_semantics),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_cpuset_calls),
        cmocka_unit_test(test_cpuset_is_an_hwloc_bitmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
