/* What a program or a binding relies on to match the library it runs against: the version it
 * was built as, one version node on every exported symbol, and the sizes of the public structs. */
#include <zenbind/adam.h>
#include <zenbind/worker.h>
#include <zenbind/zenbind.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static void versions_agree(void **state) {
    (void)state;
    /* the ABI's version is the SONAME's number; the package's is another */
    assert_int_equal(zb_api_version(), ZB_API_VERSION);
    char cmd[1200], line[512], want[64];
    snprintf(cmd, sizeof cmd, "objdump -p '%s'", ZB_LIBRARY);
    snprintf(want, sizeof want, "libzenbind.so.%d\n", ZB_API_VERSION);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int soname = 0;
    while (fgets(line, sizeof line, p))
        if (strstr(line, " SONAME ")) {
            soname = 1;
            if (!strstr(line, want)) fail_msg("SONAME is not %s: %s", want, line);
        }
    assert_int_equal(pclose(p), 0);
    assert_true(soname);
    char text[32];
    snprintf(text, sizeof text, "%d.%d.%d", ZB_VERSION_MAJOR, ZB_VERSION_MINOR, ZB_VERSION_PATCH);
    assert_string_equal(zb_version(), text);
    assert_int_equal(ZB_VERSION_NUMBER,
                     (ZB_VERSION_MAJOR << 16) | (ZB_VERSION_MINOR << 8) | ZB_VERSION_PATCH);
}

static void struct_sizes_are_the_headers(void **state) {
    (void)state;
#define SIZE(T) assert_int_equal(zb_struct_size(#T), sizeof(T))
    SIZE(zb_options);
    SIZE(zb_task_plan);
    SIZE(zb_worker_attr);
    SIZE(zb_adam_hyper);
    SIZE(zb_group_attr);
    SIZE(zb_group_buffers);
    SIZE(zb_worker_step);
    SIZE(zb_worker_result);
    SIZE(zb_worker_memory);
    SIZE(zb_step_range);
    SIZE(zb_adam_tensor);
    SIZE(zb_adam_args);
#undef SIZE
    assert_int_equal(zb_struct_size("zb_no_such_struct"), 0);
    assert_int_equal(zb_struct_size(NULL), 0);
}

/* Whether `names` (NULL-terminated) holds `name`. */
static int listed(const char *const *names, const char *name) {
    for (; *names; ++names)
        if (!strcmp(*names, name)) return 1;
    return 0;
}

/* Marks in `found` each of `names` (NULL-terminated) that is `name`. */
static void mark(const char *const *names, int *found, const char *name) {
    for (size_t i = 0; names[i]; ++i)
        if (!strcmp(names[i], name)) found[i] = 1;
}

/* Every zb_ symbol the library exports carries a version node of libzenbind.so.2: ZENBIND_2, or
 * ZENBIND_2.1 for the calls 2.1 added; the calls ABI 2 and 2.1 added are there, and those ABI 2
 * removed or made inline are not. */
static void every_symbol_is_versioned(void **state) {
    (void)state;
    static const char *const added[] = {
        "zb_cpuset_alloc",        "zb_cpuset_free",        "zb_cpuset_weight",
        "zb_cpuset_isset",        "zb_cpuset_next",        "zb_cpuset_isequal",
        "zb_plan_compute",        "zb_options_init_size",  "zb_worker_attr_init_size",
        "zb_adam_args_init_size", "zb_worker_wait_result", NULL};
    static const char *const in_2_1[] = {"zb_worker_group_set_ranges",
                                         "zb_worker_group_remove",
                                         "zb_worker_stop",
                                         "zb_adam_grad_stats",
                                         "zb_worker_group_take_state",
                                         "zb_worker_state_release",
                                         "zb_worker_group_load_state",
                                         NULL};
    static const char *const removed[] = {"zb_plan_compute_gpus",
                                          "zb_worker_wait",
                                          "zb_worker_last_step_seconds",
                                          "zb_options_init",
                                          "zb_worker_attr_init",
                                          "zb_adam_args_init",
                                          NULL};
    int found[sizeof added / sizeof *added] = {0};
    int found_2_1[sizeof in_2_1 / sizeof *in_2_1] = {0};
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", ZB_LIBRARY);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512];
    int exported = 0;
    while (fgets(line, sizeof line, p)) {
        const char *name = strrchr(line, ' ');
        if (!name || strncmp(name + 1, "zb_", 3) != 0) continue;
        ++exported;
        char bare[256];
        snprintf(bare, sizeof bare, "%.*s", (int)strcspn(name + 1, "@\n"), name + 1);
        const char *node = listed(in_2_1, bare) ? "ZENBIND_2.1" : "ZENBIND_2";
        char want[32];
        snprintf(want, sizeof want, "@@%s\n", node);
        if (!strstr(name, want)) fail_msg("export outside %s: %s", node, name + 1);
        if (listed(removed, bare)) fail_msg("a call ABI 2 removed is exported: %s", bare);
        mark(added, found, bare);
        mark(in_2_1, found_2_1, bare);
    }
    assert_int_equal(pclose(p), 0);
    for (size_t i = 0; added[i]; ++i)
        if (!found[i]) fail_msg("%s is not exported", added[i]);
    for (size_t i = 0; in_2_1[i]; ++i)
        if (!found_2_1[i]) fail_msg("%s is not exported", in_2_1[i]);
    assert_true(exported >= 40);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(versions_agree),
        cmocka_unit_test(struct_sizes_are_the_headers),
        cmocka_unit_test(every_symbol_is_versioned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
