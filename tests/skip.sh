# shellcheck shell=bash
# The shell tests' skip, as unit/skip.h is the C tests': "SKIP: why" and exit 77 (ctest's
# SKIP_RETURN_CODE), or a failure under any non-empty CI unless ZB_ALLOW_SKIP=1 says the skip is
# expected. On stderr, which ctest keeps and a caller's >/dev/null does not hide.
skip() {
    if [ -n "${CI:-}" ] && [ "${ZB_ALLOW_SKIP:-}" != 1 ]; then
        echo "FAIL: CI=$CI and a test cannot run: $* (ZB_ALLOW_SKIP=1 accepts the skip)" >&2
        exit 1
    fi
    echo "SKIP: $*" >&2
    exit 77
}
