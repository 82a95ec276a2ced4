/* A skip that is never silent: "SKIP: why" and exit status 77 (ctest's SKIP_RETURN_CODE), or a
 * failure under any non-empty CI unless ZB_ALLOW_SKIP=1 says the skip is expected. */
#ifndef ZB_TESTS_SKIP_H
#define ZB_TESTS_SKIP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int zb_test_skip(const char *why) {
    const char *ci = getenv("CI"), *allow = getenv("ZB_ALLOW_SKIP");
    if (ci && *ci && !(allow && !strcmp(allow, "1"))) {
        fprintf(stderr, "FAIL: CI=%s and a test cannot run: %s\n", ci, why);
        return 1;
    }
    fprintf(stderr, "SKIP: %s\n", why);
    return 77;
}

#endif
