/* What the worker's C tests share: a worker of some threads, a group's attributes with torch's
 * AdamW defaults, and a check of a call's status and message. */
#ifndef ZB_TESTS_WORKER_CASE_H
#define ZB_TESTS_WORKER_CASE_H

#include <zenbind/worker.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka.h comes first in each test (it needs stdarg.h, stddef.h and setjmp.h before it). */

/* The aarch64 preset runs the tests under qemu-user (ZB_TEST_QEMU_USER=1), which emulates
 * posix_spawn's vfork as a fork (an exec that fails is seen as a worker exiting with 127), has no
 * NUMA system calls (get_mempolicy, mbind) nor PR_SET_CHILD_SUBREAPER, and counts its own
 * translated code in the RSS. A check of one of these says so and is left out there: the emulator's
 * limits, not the code's. */
static inline int under_qemu_user(const char *check) {
    const char *q = getenv("ZB_TEST_QEMU_USER");
    if (!q || !*q) return 0;
    fprintf(stderr, "not checked under qemu-user: %s\n", check);
    return 1;
}

/* A worker spawned with `attr` (NULL: the defaults), which must succeed. */
static inline zb_worker_t *spawn_attr(const zb_worker_attr *attr) {
    zb_worker_t *w = NULL;
    zb_status st = zb_worker_spawn(attr, 0, &w);
    if (st != ZB_OK) fail_msg("spawn: %s: %s", zb_status_name(st), zb_last_error());
    return w;
}

/* A worker with `threads` threads on the default CPUs (ZENFLOW_OPTIMIZER names the executable). */
static inline zb_worker_t *spawn_threads(unsigned threads) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = threads;
    return spawn_attr(&attr);
}

/* A one-thread worker whose control waits are bounded by control_timeout_ms, which must spawn. */
static inline zb_worker_t *spawn_timeout(unsigned control_timeout_ms) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 1;
    attr.control_timeout_ms = control_timeout_ms;
    return spawn_attr(&attr);
}

static inline zb_group_attr group_attr(size_t numel, zb_dtype grad, zb_dtype copy, unsigned flags) {
    zb_group_attr g;
    memset(&g, 0, sizeof g);
    g.numel = numel;
    g.grad = grad;
    g.copy_out = copy;
    g.flags = flags;
    zb_adam_hyper_init(&g.hyper);
    return g;
}

/* The call gave `want`, and its message holds `needle` (NULL: any message). */
static inline void expect_status(zb_status got, zb_status want, const char *needle) {
    if (got != want)
        fail_msg("got %s (%s), want %s", zb_status_name(got), zb_last_error(),
                 zb_status_name(want));
    if (needle && !strstr(zb_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", zb_last_error(), needle);
}

#endif
