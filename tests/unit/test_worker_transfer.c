/* A group's state in and out of the worker: zb_worker_group_load_state's moments from ranges (a
 * checkpoint's tensor per parameter), zeros around them, bad tables changing nothing; and every
 * state call written into or read from the worker's memory where the system allows it (shown
 * with memfd_create refused), through a transfer segment where it does not (process_vm_writev or
 * _readv refused by a seccomp filter, as a container's may). */
#define _GNU_SOURCE
#include <zenbind/worker.h>

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>

#include <cmocka.h>

#include "worker_case.h"

/* A group of n fp32 parameters; its buffers in *b. */
static unsigned add_group(zb_worker_t *w, size_t n, zb_group_buffers *b) {
    zb_group_attr g = group_attr(n, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0);
    unsigned id = 0;
    zb_status st = zb_worker_group_add(w, &g, &id);
    if (st != ZB_OK) fail_msg("group_add: %s: %s", zb_status_name(st), zb_last_error());
    assert_int_equal(zb_worker_group_buffers(w, id, b), ZB_OK);
    return id;
}

static float *floats(size_t n, float base, float scale) {
    float *x = malloc(4 * n);
    assert_non_null(x);
    for (size_t i = 0; i < n; ++i)
        x[i] = base + scale * (float)(i % 1013);
    return x;
}

/* What a load of `ranges` must leave: their values, zeros elsewhere. */
static void expect_loaded(zb_worker_t *w, unsigned id, size_t n, const zb_state_range *ranges,
                          size_t count, int64_t step) {
    float *m = malloc(4 * n), *v = malloc(4 * n);
    assert_non_null(m);
    assert_non_null(v);
    int64_t got = -1;
    assert_int_equal(zb_worker_group_get_state(w, id, m, v, &got), ZB_OK);
    assert_int_equal(got, step);
    size_t at = 0;
    for (size_t r = 0; r <= count; ++r) {
        const size_t end = r < count ? ranges[r].offset : n;
        for (; at < end; ++at)
            if (m[at] != 0.0f || v[at] != 0.0f) fail_msg("element %zu is not zero", at);
        if (r == count) break;
        const zb_state_range *x = &ranges[r];
        for (size_t i = 0; i < x->numel; ++i) {
            const float wm = x->exp_avg ? x->exp_avg[i] : 0.0f;
            const float wv = x->exp_avg_sq ? x->exp_avg_sq[i] : 0.0f;
            if (m[x->offset + i] != wm || v[x->offset + i] != wv)
                fail_msg("range %zu, element %zu: %g %g, want %g %g", r, i, m[x->offset + i],
                         v[x->offset + i], wm, wv);
        }
        at = x->offset + x->numel;
    }
    free(m);
    free(v);
}

/* Moments everywhere, so that a load must write its zeros. */
static void fill_state(zb_worker_t *w, unsigned id, size_t n, int64_t step) {
    float *m = floats(n, 7.0f, 1.0f), *v = floats(n, 3.0f, 0.5f);
    assert_int_equal(zb_worker_group_set_state(w, id, m, v, step), ZB_OK);
    free(m);
    free(v);
}

/* Ranges with gaps longer than a block of zeros, one moment left NULL, one ending the group. Under
 * 16 MiB, so that every copy runs on the calling thread: the forked children below could not
 * start an OpenMP team once this process had run one (libgomp's threads do not survive fork). */
enum { kN = 3 * 70000 + 5 };

static size_t some_ranges(zb_state_range *r, float *a, float *b) {
    r[0] = (zb_state_range){10, 10, a, b};
    r[1] = (zb_state_range){70000, 70000, a + 100, NULL};
    r[2] = (zb_state_range){200000, kN - 200000, NULL, b + 7};
    return 3;
}

static void test_load_ranges(void **state) {
    (void)state;
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(2);
    const unsigned id = add_group(w, kN, &b);
    fill_state(w, id, kN, 3);
    float *x = floats(kN, -1.0f, 1e-3f), *y = floats(kN, 0.0f, 1e-6f);
    zb_state_range r[3];
    const size_t count = some_ranges(r, x, y);
    assert_int_equal(zb_worker_group_load_state(w, id, r, count, 12), ZB_OK);
    expect_loaded(w, id, kN, r, count, 12);
    /* No range: zeros. */
    assert_int_equal(zb_worker_group_load_state(w, id, NULL, 0, 0), ZB_OK);
    expect_loaded(w, id, kN, NULL, 0, 0);
    free(x);
    free(y);
    zb_worker_destroy(w);
}

/* More ranges than one process_vm_writev call takes (1024 pieces). */
static void test_load_many_ranges(void **state) {
    (void)state;
    enum { K = 3001, N = 2 * K + 1 };
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(1);
    const unsigned id = add_group(w, N, &b);
    fill_state(w, id, N, 1);
    float *x = floats(K, 1.0f, 1.0f), *y = floats(K, 2.0f, 1.0f);
    zb_state_range *r = malloc(K * sizeof *r);
    assert_non_null(r);
    for (size_t i = 0; i < K; ++i)
        r[i] = (zb_state_range){2 * i + 1, 1, x + i, y + i};
    assert_int_equal(zb_worker_group_load_state(w, id, r, K, 5), ZB_OK);
    expect_loaded(w, id, N, r, K, 5);
    free(r);
    free(x);
    free(y);
    zb_worker_destroy(w);
}

static void test_load_refuses_bad_tables(void **state) {
    (void)state;
    enum { N = 1000 };
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(1);
    const unsigned id = add_group(w, N, &b);
    float *x = floats(N, 1.0f, 1.0f);
    const zb_state_range whole = {0, N, x, x};
    assert_int_equal(zb_worker_group_load_state(w, id, &whole, 1, 4), ZB_OK);
    const zb_state_range bad[][2] = {
        {{0, 0, x, x}, {10, 1, x, x}},         /* empty */
        {{10, 5, x, x}, {12, 1, x, x}},        /* overlapping */
        {{10, 5, x, x}, {0, 1, x, x}},         /* out of order */
        {{990, 11, x, x}, {0, 0, NULL, NULL}}, /* past the end */
        {{SIZE_MAX, 2, x, x}, {0, 0, x, x}},   /* offset + numel overflows */
    };
    const size_t counts[] = {2, 2, 2, 1, 1};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; ++i)
        expect_status(zb_worker_group_load_state(w, id, bad[i], counts[i], 9), ZB_EINVAL, "range");
    expect_status(zb_worker_group_load_state(w, id, NULL, 1, 9), ZB_EINVAL, "NULL");
    expect_status(zb_worker_group_load_state(w, id, &whole, 1, -1), ZB_EINVAL, "step");
    expect_status(zb_worker_group_load_state(w, id + 1, &whole, 1, 9), ZB_EINVAL, "unknown");
    expect_status(zb_worker_group_load_state(NULL, id, &whole, 1, 9), ZB_EINVAL, "NULL");
    zb_worker_step st = {0, 1.0f, 0, NULL, 0, 0, 0.0f};
    assert_int_equal(zb_worker_submit(w, &st), ZB_OK);
    expect_status(zb_worker_group_load_state(w, id, &whole, 1, 9), ZB_EINVAL, "in flight");
    assert_int_equal(zb_worker_wait_result(w, 30000, NULL), ZB_OK);
    /* The step above changed the moments; a refused load changes nothing after it. */
    float *m = malloc(4 * N), *m2 = malloc(4 * N);
    assert_non_null(m);
    assert_non_null(m2);
    int64_t n = -1;
    assert_int_equal(zb_worker_group_get_state(w, id, m, NULL, &n), ZB_OK);
    assert_int_equal(n, 5);
    expect_status(zb_worker_group_load_state(w, id, bad[1], 2, 9), ZB_EINVAL, "range");
    assert_int_equal(zb_worker_group_get_state(w, id, m2, NULL, &n), ZB_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(m, m2, 4 * N);
    free(m);
    free(m2);
    free(x);
    zb_worker_destroy(w);
}

/* A seccomp filter on every thread of this process (and what it spawns) that fails system call
 * `nr` with `err`; 0, or why it could not be installed. */
static int refuse_syscall(long nr, int err) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof code / sizeof *code, code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
    /* TSYNC: > 0 is a thread that could not take the filter, and none was installed. */
    const long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
    return r < 0 ? errno : r > 0 ? EBUSY : 0;
}

/* What the worker holds, against m and v over the whole group and step: 0 if the same. */
static int holds(zb_worker_t *w, unsigned id, const float *m, const float *v, int64_t step) {
    float *gm = malloc(4 * kN), *gv = malloc(4 * kN), *tm = NULL, *tv = NULL;
    int64_t got = -1, taken_step = -1;
    zb_worker_state_t *taken = NULL;
    int bad = !gm || !gv;
    if (!bad && zb_worker_group_get_state(w, id, gm, gv, &got) != ZB_OK) {
        fprintf(stderr, "get_state: %s\n", zb_last_error());
        bad = 1;
    }
    if (!bad && zb_worker_group_take_state(w, id, &taken, &tm, &tv, &taken_step) != ZB_OK) {
        fprintf(stderr, "take_state: %s\n", zb_last_error());
        bad = 1;
    }
    if (!bad)
        bad = got != step || taken_step != step || memcmp(gm, m, 4 * kN) || memcmp(gv, v, 4 * kN) ||
              memcmp(tm, m, 4 * kN) || memcmp(tv, v, 4 * kN);
    zb_worker_state_release(taken);
    free(gm);
    free(gv);
    return bad;
}

/* Loads some_ranges and checks what the worker then holds. */
static int load_ranges(zb_worker_t *w, unsigned id) {
    float *x = floats(kN, -1.0f, 1e-3f), *y = floats(kN, 0.0f, 1e-6f);
    float *m = calloc(kN, 4), *v = calloc(kN, 4);
    zb_state_range r[3];
    const size_t count = some_ranges(r, x, y);
    if (zb_worker_group_load_state(w, id, r, count, 12) != ZB_OK) {
        fprintf(stderr, "load: %s\n", zb_last_error());
        return 1;
    }
    for (size_t i = 0; i < count; ++i) {
        if (r[i].exp_avg) memcpy(m + r[i].offset, r[i].exp_avg, 4 * r[i].numel);
        if (r[i].exp_avg_sq) memcpy(v + r[i].offset, r[i].exp_avg_sq, 4 * r[i].numel);
    }
    return holds(w, id, m, v, 12);
}

/* Sets a state and reads it back with get_state and take_state. */
static int set_and_read(zb_worker_t *w, unsigned id) {
    float *m = floats(kN, -2.0f, 1e-3f), *v = floats(kN, 1.0f, 1e-4f);
    if (zb_worker_group_set_state(w, id, m, v, 33) != ZB_OK) {
        fprintf(stderr, "set_state: %s\n", zb_last_error());
        return 1;
    }
    return holds(w, id, m, v, 33);
}

/* In a child (a seccomp filter cannot be taken off): runs `scenario` on a worker's group with
 * system call `nr` failing with `err` from `when` on (0: before the worker is spawned, 1: once
 * its group is added). The child exits 0 if the scenario holds, 1 if not, 77 if the filter
 * cannot be installed (skipped). */
static void with_syscall_refused(long nr, int err, int when,
                                 int (*scenario)(zb_worker_t *, unsigned)) {
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        alarm(120); /* a hang fails the test */
        if (when == 0 && refuse_syscall(nr, err)) _exit(77);
        zb_worker_t *w = NULL;
        zb_group_attr g = group_attr(kN, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0);
        unsigned id = 0;
        if (zb_worker_spawn(NULL, 0, &w) != ZB_OK || zb_worker_group_add(w, &g, &id) != ZB_OK) {
            fprintf(stderr, "spawn or add: %s\n", zb_last_error());
            _exit(1);
        }
        if (when == 1 && refuse_syscall(nr, err)) _exit(77);
        const int bad = scenario(w, id);
        zb_worker_destroy(w);
        _exit(bad ? 1 : 0);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        fprintf(stderr, "no seccomp filter here: not checked\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Where a process may not write into its child (a container's seccomp profile, Yama's
 * ptrace_scope 2 or 3), the moments go in through a transfer segment... */
static void test_load_without_cross_memory_writes(void **state) {
    (void)state;
    with_syscall_refused(SYS_process_vm_writev, EPERM, 0, load_ranges);
    with_syscall_refused(SYS_process_vm_writev, ENOSYS, 0, set_and_read);
}

/* ...and out, where it may not read from it. */
static void test_state_out_without_cross_memory_reads(void **state) {
    (void)state;
    with_syscall_refused(SYS_process_vm_readv, EPERM, 0, set_and_read);
    with_syscall_refused(SYS_process_vm_readv, EACCES, 0, load_ranges);
}

/* Whether this process may read its child's memory (not under Yama's ptrace_scope 2 or 3, a
 * seccomp filter against it, qemu-user). */
static int reads_its_children(void) {
    static volatile char word = 1;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        word = 42;
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char c = 0, got = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    struct iovec here = {&got, 1}, there = {(void *)&word, 1};
    const ssize_t n = process_vm_readv(child, &here, 1, &there, 1, 0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return n == 1 && got == 42;
}

/* Where it may, they need no segment either way: all works with memfd_create refused. */
static void test_state_needs_no_segment(void **state) {
    (void)state;
    if (!reads_its_children()) {
        fprintf(stderr, "this process may not read its children's memory: not checked\n");
        skip();
    }
    with_syscall_refused(SYS_memfd_create, EMFILE, 1, load_ranges);
    with_syscall_refused(SYS_memfd_create, EMFILE, 1, set_and_read);
}

/* Where it may, reading the moments without the step count asks nothing of the worker (a
 * round trip a group, which a state dict of many groups paid): it works with the worker
 * stopped, where asking for the count waits for it until control_timeout_ms. */
static void test_moments_read_without_asking_the_worker(void **state) {
    (void)state;
    if (!reads_its_children()) {
        fprintf(stderr, "this process may not read its children's memory: not checked\n");
        skip();
    }
    enum { N = 5000 };
    zb_worker_t *w = spawn_timeout(300);
    zb_group_buffers b;
    const unsigned id = add_group(w, N, &b);
    float *m = floats(N, 0.5f, 1e-3f), *v = floats(N, 1e-4f, 1e-6f), *m2 = floats(N, 0, 0),
          *v2 = floats(N, 0, 0);
    assert_int_equal(zb_worker_group_set_state(w, id, m, v, 7), ZB_OK);
    pid_t pid;
    zb_worker_pid(w, &pid);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, NULL), ZB_OK);
    assert_memory_equal(m2, m, 4 * (size_t)N);
    assert_memory_equal(v2, v, 4 * (size_t)N);
    zb_worker_state_t *taken = NULL;
    float *tm = NULL, *tv = NULL;
    assert_int_equal(zb_worker_group_take_state(w, id, &taken, &tm, &tv, NULL), ZB_OK);
    assert_memory_equal(tm, m, 4 * (size_t)N);
    assert_memory_equal(tv, v, 4 * (size_t)N);
    zb_worker_state_release(taken);
    int64_t step = -1;
    expect_status(zb_worker_group_get_state(w, id, NULL, NULL, &step), ZB_ETIMEDOUT, NULL);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
    free(m);
    free(v);
    free(m2);
    free(v2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_ranges),
        cmocka_unit_test(test_load_many_ranges),
        cmocka_unit_test(test_load_refuses_bad_tables),
        cmocka_unit_test(test_load_without_cross_memory_writes),
        cmocka_unit_test(test_state_out_without_cross_memory_reads),
        cmocka_unit_test(test_state_needs_no_segment),
        cmocka_unit_test(test_moments_read_without_asking_the_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
