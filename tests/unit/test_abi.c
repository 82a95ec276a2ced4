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
    assert_int_equal(zb_api_version(), ZB_VERSION_NUMBER);
    char text[32];
    snprintf(text, sizeof text, "%d.%d.%d", ZB_VERSION_MAJOR, ZB_VERSION_MINOR, ZB_VERSION_PATCH);
    assert_string_equal(zb_version(), text);
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
    SIZE(zb_adam_tensor);
    SIZE(zb_adam_args);
#undef SIZE
    assert_int_equal(zb_struct_size("zb_no_such_struct"), 0);
    assert_int_equal(zb_struct_size(NULL), 0);
}

/* Every zb_ symbol the library exports carries the version node of the release that added it. */
static void every_symbol_is_versioned(void **state) {
    (void)state;
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
        if (!strstr(name, "@@ZENBIND_0.1\n") && !strstr(name, "@@ZENBIND_0.2\n") &&
            !strstr(name, "@@ZENBIND_0.3\n") && !strstr(name, "@@ZENBIND_0.4\n") &&
            !strstr(name, "@@ZENBIND_0.5\n"))
            fail_msg("export outside the release nodes: %s", name + 1);
        /* A later addition carries the node of the release that added it, not 0.1's. */
        if (!strncmp(name + 1, "zb_gpus_load@", 13) && !strstr(name, "@@ZENBIND_0.2\n"))
            fail_msg("a 0.2 symbol in another node: %s", name + 1);
        if (!strncmp(name + 1, "zb_adam_step@", 13) && !strstr(name, "@@ZENBIND_0.3\n"))
            fail_msg("a 0.3 symbol in another node: %s", name + 1);
        if (!strncmp(name + 1, "zb_worker_submit_groups@", 24) && !strstr(name, "@@ZENBIND_0.4\n"))
            fail_msg("a 0.4 symbol in another node: %s", name + 1);
        if (!strncmp(name + 1, "zb_adam_hyper_check@", 20) && !strstr(name, "@@ZENBIND_0.5\n"))
            fail_msg("a 0.5 symbol in another node: %s", name + 1);
    }
    assert_int_equal(pclose(p), 0);
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
