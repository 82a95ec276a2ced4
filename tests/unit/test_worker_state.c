/* The optimizer's state and step control through the worker: checkpoint and resume are
 * bit-identical to never stopping, per-group step counts, ranges that lag their group's count or
 * are idle, groups removed newest first, skipping steps with non-finite gradients, the global
 * gradient norm and clipping by it. */
#define _GNU_SOURCE
#include <zenbind/worker.h>

#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>

#include <cmocka.h>

#include "worker_case.h"

typedef struct spec {
    size_t numel;
    zb_dtype grad, copy;
    int stale;
} spec;

static unsigned add(zb_worker_t *w, const spec *s, zb_group_buffers *b) {
    zb_group_attr g;
    memset(&g, 0, sizeof g);
    g.numel = s->numel;
    g.grad = s->grad;
    g.copy_out = s->copy;
    g.stale = s->stale; /* 0.4's name for ZB_GROUP_STALE, kept working */
    zb_adam_hyper_init(&g.hyper);
    g.hyper.lr = 1e-2f;
    unsigned id = 0;
    zb_status st = zb_worker_group_add(w, &g, &id);
    if (st != ZB_OK) fail_msg("group_add: %s: %s", zb_status_name(st), zb_last_error());
    assert_int_equal(zb_worker_group_buffers(w, id, b), ZB_OK);
    for (size_t i = 0; i < s->numel; ++i)
        b->params[i] = (float)(i % 29) * 0.05f - 0.7f;
    return id;
}

/* fp16 codes by truncation (for inputs any value will do; |g| < 2 here) and their exact values:
 * portable, where F16C is x86-64 only. */
static uint16_t f16_trunc(float g) {
    const float a = fabsf(g);
    uint16_t h;
    if (a < 0x1p-14f) {
        h = (uint16_t)(a * 0x1p24f); /* subnormal: a multiple of 2^-24 */
    } else {
        int e;
        const float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
        h = (uint16_t)(((e + 14) << 10) | (uint16_t)((m * 2.0f - 1.0f) * 1024.0f));
    }
    return (uint16_t)(h | (g < 0 ? 0x8000 : 0));
}

static float f16_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const float v = e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return h & 0x8000 ? -v : v;
}

/* Deterministic gradients of a group for a step: the same on every worker that replays it. */
static void fill(const zb_group_buffers *b, unsigned buffer, uint32_t seed) {
    for (size_t i = 0; i < b->numel; ++i) {
        seed = seed * 1664525u + 1013904223u;
        const float g = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 3.0f;
        uint32_t u;
        memcpy(&u, &g, 4);
        if (b->grad == ZB_DTYPE_FP32)
            ((float *)b->grads[buffer])[i] = g;
        else if (b->grad == ZB_DTYPE_BF16)
            ((uint16_t *)b->grads[buffer])[i] = (uint16_t)(u >> 16);
        else
            ((uint16_t *)b->grads[buffer])[i] = f16_trunc(g);
    }
}

static zb_status step_ex(zb_worker_t *w, int64_t n, unsigned buffer, float scale, unsigned flags,
                         float max_norm, zb_worker_result *r) {
    zb_worker_step s = {n, scale, buffer, NULL, 0, flags, max_norm};
    zb_status st = zb_worker_submit(w, &s);
    if (st != ZB_OK) return st;
    return zb_worker_wait_result(w, 30000, r);
}

static zb_worker_result step_ok(zb_worker_t *w, int64_t n, unsigned buffer, float scale,
                                unsigned flags, float max_norm) {
    zb_worker_result r;
    memset(&r, 0xff, sizeof r);
    zb_status st = step_ex(w, n, buffer, scale, flags, max_norm, &r);
    if (st != ZB_OK) fail_msg("step: %s: %s", zb_status_name(st), zb_last_error());
    return r;
}

/* Fills every group's gradients for step s (buffer s & 1) and runs it with step number 0. */
static void replay(zb_worker_t *w, zb_group_buffers *b, size_t ngroups, int s) {
    for (size_t g = 0; g < ngroups; ++g)
        fill(&b[g], (unsigned)(s & 1), (uint32_t)(s * 131 + (int)g));
    step_ok(w, 0, (unsigned)(s & 1), 0.5f, 0, 0.0f);
}

/* Everything a step can write, of one group. */
typedef struct snapshot {
    float *params, *m, *v, *stale;
    void *copy;
    int64_t step;
} snapshot;

static snapshot take(zb_worker_t *w, unsigned id, const zb_group_buffers *b) {
    snapshot s;
    const size_t n = b->numel;
    s.params = malloc(4 * n);
    s.m = malloc(4 * n);
    s.v = malloc(4 * n);
    s.stale = malloc(4 * n);
    s.copy = malloc(2 * n);
    memcpy(s.params, b->params, 4 * n);
    if (b->stale) memcpy(s.stale, b->stale, 4 * n);
    if (b->copy_out) memcpy(s.copy, b->copy_out, 2 * n);
    zb_status st = zb_worker_group_get_state(w, id, s.m, s.v, &s.step);
    if (st != ZB_OK) fail_msg("get_state: %s: %s", zb_status_name(st), zb_last_error());
    return s;
}

static void same(const snapshot *a, const snapshot *b, const zb_group_buffers *buf) {
    const size_t n = buf->numel;
    assert_memory_equal(a->params, b->params, 4 * n);
    assert_memory_equal(a->m, b->m, 4 * n);
    assert_memory_equal(a->v, b->v, 4 * n);
    if (buf->stale) assert_memory_equal(a->stale, b->stale, 4 * n);
    if (buf->copy_out) assert_memory_equal(a->copy, b->copy, 2 * n);
    assert_int_equal(a->step, b->step);
}

static void drop(snapshot *s) {
    free(s->params);
    free(s->m);
    free(s->v);
    free(s->stale);
    free(s->copy);
}

enum { kCombos = 9 };

static void combos(spec *s) {
    const zb_dtype grads[] = {ZB_DTYPE_FP32, ZB_DTYPE_BF16, ZB_DTYPE_FP16};
    const zb_dtype copies[] = {ZB_DTYPE_NONE, ZB_DTYPE_BF16, ZB_DTYPE_FP16};
    for (int i = 0; i < kCombos; ++i) {
        s[i].numel = 1000 + 37 * (size_t)i;
        s[i].grad = grads[i / 3];
        s[i].copy = copies[i % 3];
        s[i].stale = i & 1;
    }
}

/* N steps straight against K steps, checkpoint (params by the caller, moments and counts by
 * get_state), a new worker of another thread count, restore, N - K steps: the same bits. */
static void test_checkpoint_resume(void **state) {
    (void)state;
    enum { N = 7, K = 3 };
    spec s[kCombos];
    combos(s);
    zb_group_buffers a[kCombos], b[kCombos], c[kCombos];
    unsigned ia[kCombos], ib[kCombos], ic[kCombos];
    zb_worker_t *straight = spawn_threads(2), *first = spawn_threads(2);
    for (int g = 0; g < kCombos; ++g) {
        ia[g] = add(straight, &s[g], &a[g]);
        ib[g] = add(first, &s[g], &b[g]);
    }
    for (int i = 1; i <= N; ++i)
        replay(straight, a, kCombos, i);
    for (int i = 1; i <= K; ++i)
        replay(first, b, kCombos, i);
    snapshot saved[kCombos];
    for (int g = 0; g < kCombos; ++g) {
        saved[g] = take(first, ib[g], &b[g]);
        assert_int_equal(saved[g].step, K);
    }
    assert_int_equal(zb_worker_destroy(first), ZB_OK);

    zb_worker_t *resumed = spawn_threads(3);
    for (int g = 0; g < kCombos; ++g) {
        ic[g] = add(resumed, &s[g], &c[g]);
        memcpy(c[g].params, saved[g].params, 4 * s[g].numel);
        assert_int_equal(
            zb_worker_group_set_state(resumed, ic[g], saved[g].m, saved[g].v, saved[g].step),
            ZB_OK);
    }
    for (int i = K + 1; i <= N; ++i)
        replay(resumed, c, kCombos, i);
    for (int g = 0; g < kCombos; ++g) {
        snapshot x = take(straight, ia[g], &a[g]), y = take(resumed, ic[g], &c[g]);
        assert_int_equal(x.step, N);
        same(&x, &y, &a[g]);
        drop(&x);
        drop(&y);
        drop(&saved[g]);
    }
    assert_int_equal(zb_worker_destroy(straight), ZB_OK);
    assert_int_equal(zb_worker_destroy(resumed), ZB_OK);
}

/* Step 0 gives each group its own count: a group added after 10 steps gets step 1's bias
 * correction, as a fresh worker's only group does. */
static void test_per_group_counts(void **state) {
    (void)state;
    const spec s = {5000, ZB_DTYPE_FP32, ZB_DTYPE_BF16, 1};
    zb_group_buffers b[2], fresh;
    zb_worker_t *w = spawn_threads(2), *f = spawn_threads(2);
    unsigned first = add(w, &s, &b[0]);
    for (int i = 1; i <= 10; ++i)
        replay(w, b, 1, i);
    unsigned late = add(w, &s, &b[1]);
    unsigned only = add(f, &s, &fresh);
    fill(&b[0], 1, 77);
    fill(&b[1], 1, 99);
    fill(&fresh, 1, 99);
    step_ok(w, 0, 1, 0.5f, 0, 0.0f);
    step_ok(f, 0, 1, 0.5f, 0, 0.0f);
    assert_memory_equal(b[1].params, fresh.params, 4 * s.numel);
    assert_memory_equal(b[1].copy_out, fresh.copy_out, 2 * s.numel);
    int64_t n = -1;
    assert_int_equal(zb_worker_group_get_state(w, first, NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, 11);
    assert_int_equal(zb_worker_group_get_state(w, late, NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, 1);
    assert_int_equal(zb_worker_group_get_state(f, only, NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, 1);
    zb_worker_destroy(w);
    zb_worker_destroy(f);
}

/* The newest group removed: its memory leaves both processes, the group before it steps on as
 * if it had never been there, and the next group added takes its id. Others, and any group while
 * a step is in flight, are refused. */
static void test_remove_group(void **state) {
    (void)state;
    const spec small = {5000, ZB_DTYPE_FP32, ZB_DTYPE_BF16, 1};
    const spec big = {1u << 23, ZB_DTYPE_BF16, ZB_DTYPE_BF16, 0}; /* 64 MiB of moments */
    zb_group_buffers b[2], fresh[2], gone;
    zb_worker_t *w = spawn_threads(2), *f = spawn_threads(2);
    const unsigned first = add(w, &small, &b[0]);
    add(f, &small, &fresh[0]);
    zb_worker_memory before, with, after;
    assert_int_equal(zb_worker_memory_usage(w, &before), ZB_OK);
    const unsigned big_id = add(w, &big, &gone);
    assert_int_equal(big_id, first + 1);
    assert_int_equal(zb_worker_memory_usage(w, &with), ZB_OK);
    expect_status(zb_worker_group_remove(w, first), ZB_EINVAL, "not the newest");
    expect_status(zb_worker_group_remove(w, big_id + 1), ZB_EINVAL, "unknown group");
    fill(&b[0], 0, 5);
    fill(&gone, 0, 6);
    zb_worker_step s = {0, 1.0f, 0, NULL, 0, 0, 0.0f};
    assert_int_equal(zb_worker_submit(w, &s), ZB_OK);
    expect_status(zb_worker_group_remove(w, big_id), ZB_EINVAL, "in flight");
    assert_int_equal(zb_worker_wait_result(w, 30000, NULL), ZB_OK);
    fill(&fresh[0], 0, 5);
    step_ok(f, 0, 0, 1.0f, 0, 0.0f); /* the small group's step, on a worker that never had big */

    assert_int_equal(zb_worker_group_remove(w, big_id), ZB_OK);
    assert_int_equal(zb_worker_memory_usage(w, &after), ZB_OK);
    assert_int_equal(after.numel, before.numel);
    assert_int_equal(after.moments, before.moments);
    assert_int_equal(after.grads, before.grads);
    assert_int_equal(after.copy_out, before.copy_out);
    assert_int_equal(after.shm_reserved, before.shm_reserved);
    if (!under_qemu_user("the worker's RSS after a group is removed")) {
        /* its moments, 64 MiB the worker zeroed, come and go (all but a few pages of them) */
        assert_true(with.worker_rss >= before.worker_rss + (60u << 20));
        assert_true(after.worker_rss + (60u << 20) <= with.worker_rss);
    }

    const unsigned again = add(w, &small, &b[1]);
    add(f, &small, &fresh[1]);
    assert_int_equal(again, big_id);
    for (int i = 2; i <= 4; ++i) {
        replay(w, b, 2, i);
        replay(f, fresh, 2, i);
    }
    for (unsigned g = 0; g < 2; ++g) {
        snapshot x = take(w, g, &b[g]), y = take(f, g, &fresh[g]);
        same(&x, &y, &b[g]);
        drop(&x);
        drop(&y);
    }
    zb_worker_destroy(w);
    zb_worker_destroy(f);
}

/* An explicit step number is used by every group and becomes its count; step 0 continues from
 * it. The same as giving every number explicitly. */
static void test_explicit_step(void **state) {
    (void)state;
    const spec s = {3000, ZB_DTYPE_BF16, ZB_DTYPE_NONE, 0};
    zb_group_buffers a, b;
    zb_worker_t *x = spawn_threads(1), *y = spawn_threads(2);
    unsigned ia = add(x, &s, &a), ib = add(y, &s, &b);
    fill(&a, 0, 5);
    fill(&b, 0, 5);
    step_ok(x, 5, 0, 1.0f, 0, 0.0f);
    step_ok(y, 5, 0, 1.0f, 0, 0.0f);
    int64_t n = -1;
    assert_int_equal(zb_worker_group_get_state(x, ia, NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, 5);
    step_ok(x, 0, 0, 1.0f, 0, 0.0f);
    step_ok(y, 6, 0, 1.0f, 0, 0.0f);
    assert_memory_equal(a.params, b.params, 4 * s.numel);
    assert_int_equal(zb_worker_group_get_state(y, ib, NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, 6);
    /* A count that step 0 would overflow is refused, writing nothing. */
    assert_int_equal(zb_worker_group_set_state(x, ia, NULL, NULL, INT64_MAX), ZB_OK);
    snapshot before = take(x, ia, &a);
    zb_status st = step_ex(x, 0, 0, 1.0f, 0, 0.0f, NULL);
    assert_int_equal(st, ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "overflow"));
    snapshot after = take(x, ia, &a);
    same(&before, &after, &a);
    drop(&before);
    drop(&after);
    zb_worker_destroy(x);
    zb_worker_destroy(y);
}

/* Ranges that lag their group's count are stepped with their own step number, bit for bit as a
 * group of that count, clipping included, across steps; idle ranges are left alone and resume
 * with their own count; the rest of the group steps as before. A refused table changes nothing;
 * count 0 clears it; a step number not above a lag is refused. */
static void test_step_ranges(void **state) {
    (void)state;
    const spec s = {3000, ZB_DTYPE_BF16, ZB_DTYPE_BF16, 1};
    const int64_t counts[4] = {3, 0, 9, 0}; /* the references: lag 6, lag 9, none, fresh */
    zb_group_buffers a, r[4];
    zb_worker_t *w = spawn_threads(2), *ref[4];
    const unsigned ia = add(w, &s, &a);
    assert_int_equal(zb_worker_group_set_state(w, ia, NULL, NULL, 9), ZB_OK);
    unsigned ir[4];
    for (int k = 0; k < 4; ++k) {
        ref[k] = spawn_threads(k % 3 + 1);
        ir[k] = add(ref[k], &s, &r[k]);
        assert_int_equal(zb_worker_group_set_state(ref[k], ir[k], NULL, NULL, counts[k]), ZB_OK);
    }
    const zb_step_range ranges[3] = {
        {100, 700, 6, 0, 0}, {1000, 33, 9, 0, 0}, {2000, 100, 0, 1, 0}};
    assert_int_equal(zb_worker_group_set_ranges(w, ia, ranges, 3), ZB_OK);
    /* Refused whole: out of order, overlapping, empty, past the end, neither lagging nor idle,
     * a bad idle value, a reserved field set, NULL. */
    const zb_step_range bad[][2] = {
        {{1000, 33, 9, 0, 0}, {100, 700, 6, 0, 0}}, {{100, 700, 6, 0, 0}, {799, 3, 1, 0, 0}},
        {{100, 0, 6, 0, 0}, {1000, 1, 1, 0, 0}},    {{100, 700, 6, 0, 0}, {2990, 11, 1, 0, 0}},
        {{100, 700, 0, 0, 0}, {1000, 1, 1, 0, 0}},  {{100, 700, 0, 2, 0}, {1000, 1, 1, 0, 0}},
        {{100, 700, 1, 0, 1}, {1000, 1, 1, 0, 0}},  {{100, 700, -1, 1, 0}, {1000, 1, 1, 0, 0}}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; ++k)
        expect_status(zb_worker_group_set_ranges(w, ia, bad[k], 2), ZB_EINVAL, "step ranges");
    expect_status(zb_worker_group_set_ranges(w, ia, NULL, 1), ZB_EINVAL, "NULL");
    expect_status(zb_worker_group_set_ranges(w, 5, ranges, 1), ZB_EINVAL, "unknown group");
    float idle_params[100];
    memcpy(idle_params, a.params + 2000, sizeof idle_params);
    /* Two steps, the first clipped (each group alone in its worker: the same norm; the idle
     * range's gradients are zero, as a trainer leaves those of a parameter without one). */
    for (int step = 0; step < 2; ++step) {
        fill(&a, 0, 40u + (uint32_t)step);
        memset((uint16_t *)a.grads[0] + 2000, 0, 2 * 100);
        for (int k = 0; k < 3; ++k) {
            fill(&r[k], 0, 40u + (uint32_t)step);
            memset((uint16_t *)r[k].grads[0] + 2000, 0, 2 * 100);
        }
        const float clip = step == 0 ? 1.0f : 0.0f;
        step_ok(w, 0, 0, 0.5f, 0, clip);
        for (int k = 0; k < 3; ++k)
            step_ok(ref[k], 0, 0, 0.5f, 0, clip);
        const size_t from[3] = {100, 1000, 0}, to[3] = {800, 1033, 100};
        for (int k = 0; k < 3; ++k) {
            assert_memory_equal(a.params + from[k], r[k].params + from[k], 4 * (to[k] - from[k]));
            assert_memory_equal(a.stale + from[k], r[k].stale + from[k], 4 * (to[k] - from[k]));
            assert_memory_equal((uint16_t *)a.copy_out + from[k],
                                (uint16_t *)r[k].copy_out + from[k], 2 * (to[k] - from[k]));
        }
        assert_memory_equal(a.params + 800, r[2].params + 800, 4 * 200);
        assert_memory_equal(a.params + 1033, r[2].params + 1033, 4 * (2000 - 1033));
        assert_memory_equal(a.params + 2100, r[2].params + 2100, 4 * (3000 - 2100));
        assert_memory_equal(a.params + 2000, idle_params, sizeof idle_params);
    }
    int64_t n = -1;
    snapshot now = take(w, ia, &a);
    assert_int_equal(now.step, 11); /* the group's own count */
    for (size_t i = 2000; i < 2100; ++i)
        assert_true(now.m[i] == 0.0f && now.v[i] == 0.0f);
    drop(&now);
    /* A step number the lag of 9 would take to 0 or below: refused, nothing written. */
    snapshot before = take(w, ia, &a);
    expect_status(step_ex(w, 9, 0, 1.0f, 0, 0.0f, NULL), ZB_EINVAL, "lags 9 steps");
    snapshot after = take(w, ia, &a);
    same(&before, &after, &a);
    drop(&before);
    drop(&after);
    /* The idle range resumes 11 steps behind: its first step, as a fresh group's. */
    const zb_step_range resumed[2] = {{100, 700, 6, 0, 0}, {2000, 100, 11, 0, 0}};
    assert_int_equal(zb_worker_group_set_ranges(w, ia, resumed, 2), ZB_OK);
    fill(&a, 0, 9);
    fill(&r[0], 0, 9);
    fill(&r[3], 0, 9);
    step_ok(w, 0, 0, 0.5f, 0, 0.0f);
    step_ok(ref[0], 0, 0, 0.5f, 0, 0.0f);
    step_ok(ref[3], 0, 0, 0.5f, 0, 0.0f);
    assert_memory_equal(a.params + 100, r[0].params + 100, 4 * 700);
    assert_memory_equal(a.params + 2000, r[3].params + 2000, 4 * 100);
    /* Cleared: every element steps as the group, the first range as step 13 (its reference
     * given the group's count, its moments kept). */
    assert_int_equal(zb_worker_group_set_ranges(w, ia, NULL, 0), ZB_OK);
    snapshot kept = take(ref[0], ir[0], &r[0]);
    assert_int_equal(zb_worker_group_set_state(ref[0], ir[0], kept.m, kept.v, 12), ZB_OK);
    drop(&kept);
    fill(&a, 0, 7);
    fill(&r[0], 0, 7);
    step_ok(w, 0, 0, 0.5f, 0, 0.0f);
    step_ok(ref[0], 0, 0, 0.5f, 0, 0.0f);
    assert_memory_equal(a.params + 100, r[0].params + 100, 4 * 700);
    /* A group idle whole: nothing written, its count goes on. */
    const zb_step_range all = {0, 3000, 0, 1, 0};
    assert_int_equal(zb_worker_group_set_ranges(ref[1], ir[1], &all, 1), ZB_OK);
    snapshot still = take(ref[1], ir[1], &r[1]);
    fill(&r[1], 0, 3);
    step_ok(ref[1], 0, 0, 0.5f, 0, 0.0f);
    snapshot later = take(ref[1], ir[1], &r[1]);
    assert_memory_equal(still.params, later.params, 4 * 3000);
    assert_memory_equal(still.m, later.m, 4 * 3000);
    assert_memory_equal(still.v, later.v, 4 * 3000);
    assert_int_equal(zb_worker_group_get_state(ref[1], ir[1], NULL, NULL, &n), ZB_OK);
    assert_int_equal(n, still.step + 1);
    drop(&still);
    drop(&later);
    zb_worker_destroy(w);
    for (int k = 0; k < 4; ++k)
        zb_worker_destroy(ref[k]);
}

/* An fp16 overflow under ZB_STEP_SKIP_NONFINITE writes nothing; without the flag it is applied.
 * On finite gradients the flag changes nothing. */
static void test_skip_nonfinite(void **state) {
    (void)state;
    const spec s[2] = {{70001, ZB_DTYPE_FP16, ZB_DTYPE_FP16, 1},
                       {4099, ZB_DTYPE_FP32, ZB_DTYPE_BF16, 1}};
    zb_group_buffers b[2], r[2];
    unsigned id[2];
    zb_worker_t *w = spawn_threads(2), *ref = spawn_threads(2);
    for (int g = 0; g < 2; ++g) {
        id[g] = add(w, &s[g], &b[g]);
        add(ref, &s[g], &r[g]);
    }
    for (int i = 1; i <= 3; ++i) {
        for (int g = 0; g < 2; ++g) {
            fill(&b[g], (unsigned)(i & 1), (uint32_t)(i * 7 + g));
            fill(&r[g], (unsigned)(i & 1), (uint32_t)(i * 7 + g));
        }
        zb_worker_result res = step_ok(w, 0, (unsigned)(i & 1), 0.5f, ZB_STEP_SKIP_NONFINITE, 0);
        step_ok(ref, 0, (unsigned)(i & 1), 0.5f, 0, 0.0f);
        assert_int_equal(res.skipped, 0);
        assert_int_equal(res.nonfinite, 0);
        assert_true(res.grad_norm > 0 && isfinite(res.grad_norm));
    }
    for (int g = 0; g < 2; ++g)
        assert_memory_equal(b[g].params, r[g].params, 4 * s[g].numel);

    fill(&b[0], 0, 1234);
    fill(&b[1], 0, 4321);
    ((uint16_t *)b[0].grads[0])[65600] = 0x7c00; /* +inf: the loss scale overflowed fp16 */
    snapshot before[2];
    for (int g = 0; g < 2; ++g)
        before[g] = take(w, id[g], &b[g]);
    zb_worker_result res = step_ok(w, 0, 0, 0.5f, ZB_STEP_SKIP_NONFINITE, 0);
    assert_int_equal(res.skipped, 1);
    assert_int_equal(res.nonfinite, 1);
    assert_true(isinf(res.grad_norm));
    for (int g = 0; g < 2; ++g) {
        snapshot after = take(w, id[g], &b[g]);
        same(&before[g], &after, &b[g]);
        assert_int_equal(after.step, 3);
        drop(&after);
    }
    /* Without the flag: applied, as torch does. */
    res = step_ok(w, 0, 0, 0.5f, 0, 0.0f);
    assert_int_equal(res.skipped, 0);
    assert_int_equal(res.nonfinite, 1);
    assert_true(res.grad_norm == 0.0); /* not asked for */
    snapshot after = take(w, id[0], &b[0]);
    assert_int_equal(after.step, 4);
    assert_true(isnan(after.params[65600]));
    assert_true(memcmp(after.params, before[0].params, 4 * 65600) != 0);
    drop(&after);
    for (int g = 0; g < 2; ++g)
        drop(&before[g]);
    zb_worker_destroy(w);
    zb_worker_destroy(ref);
}

static double to_double(const zb_group_buffers *b, unsigned buffer, size_t i, float scale) {
    float g;
    if (b->grad == ZB_DTYPE_FP32) {
        g = ((const float *)b->grads[buffer])[i];
    } else if (b->grad == ZB_DTYPE_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)b->grads[buffer])[i] << 16;
        memcpy(&g, &u, 4);
    } else {
        g = f16_value(((const uint16_t *)b->grads[buffer])[i]);
    }
    return (double)(g * scale);
}

/* The norm of the scaled gradients over every group, against a double reference, and the same
 * bits for 1, 2 and 3 threads (blocks cross group and thread boundaries). */
static void test_grad_norm(void **state) {
    (void)state;
    const spec s[3] = {{200003, ZB_DTYPE_BF16, ZB_DTYPE_NONE, 0},
                       {70000, ZB_DTYPE_FP16, ZB_DTYPE_NONE, 0},
                       {5, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0}};
    double norms[3];
    for (unsigned threads = 1; threads <= 3; ++threads) {
        zb_worker_t *w = spawn_threads(threads);
        zb_group_buffers b[3];
        double ref = 0;
        for (int g = 0; g < 3; ++g) {
            add(w, &s[g], &b[g]);
            fill(&b[g], 1, (uint32_t)(g + 11));
            for (size_t i = 0; i < s[g].numel; ++i) {
                const double x = to_double(&b[g], 1, i, 0.25f);
                ref += x * x;
            }
        }
        ref = sqrt(ref);
        zb_worker_result r = step_ok(w, 0, 1, 0.25f, ZB_STEP_GRAD_NORM, 0);
        assert_int_equal(r.skipped, 0);
        assert_int_equal(r.nonfinite, 0);
        if (fabs(r.grad_norm - ref) > 1e-6 * ref)
            fail_msg("norm %.17g, reference %.17g", r.grad_norm, ref);
        norms[threads - 1] = r.grad_norm;
        zb_worker_destroy(w);
    }
    assert_memory_equal(&norms[0], &norms[1], sizeof(double));
    assert_memory_equal(&norms[0], &norms[2], sizeof(double));
}

/* Clipping multiplies the gradients by min(1, max / (norm + 1e-6)) in the update pass: the same
 * params as gradients pre-scaled by that coefficient on the trainer side; a bound above the norm
 * changes nothing. */
static void test_clipping(void **state) {
    (void)state;
    const spec s[2] = {{100000, ZB_DTYPE_FP32, ZB_DTYPE_BF16, 0},
                       {333, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 1}};
    zb_worker_t *clip = spawn_threads(2), *pre = spawn_threads(1), *loose = spawn_threads(2),
                *plain = spawn_threads(2);
    zb_group_buffers c[2], p[2], l[2], q[2];
    for (int g = 0; g < 2; ++g) {
        add(clip, &s[g], &c[g]);
        add(pre, &s[g], &p[g]);
        add(loose, &s[g], &l[g]);
        add(plain, &s[g], &q[g]);
        fill(&c[g], 0, (uint32_t)(g + 3));
        fill(&l[g], 0, (uint32_t)(g + 3));
        fill(&q[g], 0, (uint32_t)(g + 3));
    }
    const float max_norm = 2.0f;
    zb_worker_result r = step_ok(clip, 0, 0, 1.0f, 0, max_norm);
    assert_true(r.grad_norm > 10.0 * max_norm); /* the test must really clip */
    const float coefficient = (float)(max_norm / (r.grad_norm + 1e-6));
    for (int g = 0; g < 2; ++g) {
        fill(&p[g], 0, (uint32_t)(g + 3));
        float *grad = p[g].grads[0];
        for (size_t i = 0; i < s[g].numel; ++i)
            grad[i] *= coefficient;
    }
    step_ok(pre, 0, 0, 1.0f, 0, 0.0f);
    zb_worker_result big = step_ok(loose, 0, 0, 1.0f, 0, (float)(r.grad_norm * 2));
    assert_true(big.grad_norm == r.grad_norm);
    step_ok(plain, 0, 0, 1.0f, 0, 0.0f);
    for (int g = 0; g < 2; ++g) {
        assert_memory_equal(c[g].params, p[g].params, 4 * s[g].numel);
        assert_memory_equal(l[g].params, q[g].params, 4 * s[g].numel);
        assert_true(memcmp(c[g].params, q[g].params, 4 * s[g].numel) != 0);
    }
    zb_worker_destroy(clip);
    zb_worker_destroy(pre);
    zb_worker_destroy(loose);
    zb_worker_destroy(plain);
}

static void test_state_arguments(void **state) {
    (void)state;
    const spec s = {1000, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0};
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(1);
    unsigned id = add(w, &s, &b);
    float m[1000], v[1000];
    int64_t n = -1;
    /* A fresh group: zero moments, no step. */
    memset(m, 0xff, sizeof m);
    assert_int_equal(zb_worker_group_get_state(w, id, m, NULL, &n), ZB_OK);
    assert_int_equal(n, 0);
    for (size_t i = 0; i < 1000; ++i)
        assert_true(m[i] == 0.0f);
    expect_status(zb_worker_group_get_state(w, 1, m, v, &n), ZB_EINVAL, "unknown group 1");
    expect_status(zb_worker_group_set_state(w, 1, m, v, 0), ZB_EINVAL, "unknown group 1");
    expect_status(zb_worker_group_set_state(w, id, m, v, -1), ZB_EINVAL, "step");
    expect_status(zb_worker_group_get_state(NULL, id, m, v, &n), ZB_EINVAL, "NULL");
    expect_status(zb_worker_group_set_state(NULL, id, m, v, 0), ZB_EINVAL, "NULL");
    fill(&b, 0, 1);
    zb_worker_step st = {0, 1.0f, 0, NULL, 0, 0, 0.0f};
    assert_int_equal(zb_worker_submit(w, &st), ZB_OK);
    expect_status(zb_worker_group_get_state(w, id, m, v, &n), ZB_EINVAL, "in flight");
    expect_status(zb_worker_group_set_state(w, id, m, v, 3), ZB_EINVAL, "in flight");
    assert_int_equal(zb_worker_wait_result(w, 30000, NULL), ZB_OK);
    /* Written as given, NULL meaning zeros. */
    for (size_t i = 0; i < 1000; ++i)
        m[i] = (float)i, v[i] = (float)(2 * i);
    assert_int_equal(zb_worker_group_set_state(w, id, m, NULL, 41), ZB_OK);
    float m2[1000], v2[1000];
    memset(v2, 0xff, sizeof v2);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, &n), ZB_OK);
    assert_memory_equal(m, m2, sizeof m);
    for (size_t i = 0; i < 1000; ++i)
        assert_true(v2[i] == 0.0f);
    assert_int_equal(n, 41);
    assert_int_equal(zb_worker_group_set_state(w, id, NULL, v, 7), ZB_OK);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, NULL), ZB_OK);
    assert_memory_equal(v, v2, sizeof v);
    assert_true(m2[0] == 0.0f && m2[999] == 0.0f);
    zb_worker_destroy(w);
}

/* A group whose moments the trainer copies in chunks on several threads (over 16 MiB each, not a
 * multiple of the 2 MiB chunk): set, and got back whole. */
static void test_state_of_a_large_group(void **state) {
    (void)state;
    enum { N = 5000003 };
    const spec s = {N, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0};
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(2);
    unsigned id = add(w, &s, &b);
    float *m = malloc(4 * (size_t)N), *v = malloc(4 * (size_t)N), *m2 = malloc(4 * (size_t)N),
          *v2 = malloc(4 * (size_t)N);
    assert_non_null(m);
    assert_non_null(v);
    assert_non_null(m2);
    assert_non_null(v2);
    for (size_t i = 0; i < N; ++i) {
        m[i] = (float)(i % 1000003) * 1e-6f - 0.5f;
        v[i] = (float)(i % 999983) * 1e-9f;
    }
    assert_int_equal(zb_worker_group_set_state(w, id, m, v, 5), ZB_OK);
    int64_t n = -1;
    memset(m2, 0xff, 4 * (size_t)N);
    memset(v2, 0xff, 4 * (size_t)N);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, &n), ZB_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(m, m2, 4 * (size_t)N);
    assert_memory_equal(v, v2, 4 * (size_t)N);
    free(m);
    free(v);
    free(m2);
    free(v2);
    zb_worker_destroy(w);
}

/* The worker to kill as the library reads or writes its memory straight, 0 for none: this
 * program's process_vm_readv and _writev, which the library's calls reach first, kill it and
 * wait (without reaping) until it is gone, then call the real ones. */
static pid_t kill_in_transfer;

static ssize_t transfer_after_kill(const char *name, pid_t pid, const struct iovec *local,
                                   unsigned long nlocal, const struct iovec *remote,
                                   unsigned long nremote, unsigned long flags) {
    ssize_t (*real)(pid_t, const struct iovec *, unsigned long, const struct iovec *, unsigned long,
                    unsigned long);
    *(void **)&real = dlsym(RTLD_NEXT, name);
    if (kill_in_transfer > 0) {
        siginfo_t info;
        kill(kill_in_transfer, SIGKILL);
        waitid(P_PID, (id_t)kill_in_transfer, &info, WEXITED | WNOWAIT);
        kill_in_transfer = 0;
    }
    return real(pid, local, nlocal, remote, nremote, flags);
}

ssize_t process_vm_readv(pid_t pid, const struct iovec *local, unsigned long nlocal,
                         const struct iovec *remote, unsigned long nremote, unsigned long flags) {
    return transfer_after_kill("process_vm_readv", pid, local, nlocal, remote, nremote, flags);
}

ssize_t process_vm_writev(pid_t pid, const struct iovec *local, unsigned long nlocal,
                          const struct iovec *remote, unsigned long nremote, unsigned long flags) {
    return transfer_after_kill("process_vm_writev", pid, local, nlocal, remote, nremote, flags);
}

/* A worker that dies while its moments are read or written is ZB_EDEAD saying how it died, as a
 * death found at any other time is. */
static void test_death_during_a_state_transfer(void **state) {
    (void)state;
    enum { N = 1000 };
    const spec s = {N, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0};
    static float m[N], v[N];
    for (int write = 0; write <= 1; ++write) {
        zb_group_buffers b;
        zb_worker_t *w = spawn_threads(1);
        unsigned id = add(w, &s, &b);
        pid_t pid;
        zb_worker_pid(w, &pid);
        kill_in_transfer = pid;
        expect_status(write ? zb_worker_group_set_state(w, id, m, v, 3)
                            : zb_worker_group_get_state(w, id, m, v, NULL),
                      ZB_EDEAD, "signal 9");
        assert_int_equal(kill_in_transfer, 0); /* the transfer came after the death */
        assert_int_equal(zb_worker_destroy(w), ZB_OK);
    }
}

/* The state taken without a copy into the caller's memory: what get_state returns, private to the
 * caller (its writes reach neither the worker nor a forked child's view, nor the child's the
 * parent's), unchanged by later steps, readable after the worker is gone. */
static void test_taken_state(void **state) {
    (void)state;
    enum { N = 300007 };
    const spec s = {N, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0};
    zb_group_buffers b;
    zb_worker_t *w = spawn_threads(2);
    unsigned id = add(w, &s, &b);
    float *m = malloc(4 * (size_t)N), *v = malloc(4 * (size_t)N);
    assert_non_null(m);
    assert_non_null(v);
    for (size_t i = 0; i < N; ++i)
        m[i] = (float)(i % 1009) * 1e-3f - 0.5f, v[i] = (float)(i % 997) * 1e-6f;
    assert_int_equal(zb_worker_group_set_state(w, id, m, v, 41), ZB_OK);

    zb_worker_state_t *taken = NULL;
    float *tm = NULL, *tv = NULL;
    int64_t n = -1;
    assert_int_equal(zb_worker_group_take_state(w, id, &taken, &tm, &tv, &n), ZB_OK);
    assert_non_null(taken);
    assert_int_equal(n, 41);
    assert_int_equal((uintptr_t)tm % 64, 0);
    assert_int_equal((uintptr_t)tv % 64, 0);
    assert_memory_equal(tm, m, 4 * (size_t)N);
    assert_memory_equal(tv, v, 4 * (size_t)N);

    /* Written by the caller: the worker keeps its own. */
    tm[0] = 123.0f;
    tv[N - 1] = 456.0f;
    float *m2 = malloc(4 * (size_t)N), *v2 = malloc(4 * (size_t)N);
    assert_non_null(m2);
    assert_non_null(v2);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, NULL), ZB_OK);
    assert_memory_equal(m2, m, 4 * (size_t)N);
    assert_memory_equal(v2, v, 4 * (size_t)N);

    /* A forked child's writes stay in the child. */
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        const int same = tm[0] == 123.0f && tv[1] == v[1];
        tm[1] = -1.0f;
        _exit(same ? 0 : 1);
    }
    int wstatus = 0;
    assert_int_equal(waitpid(child, &wstatus, 0), child);
    assert_true(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    assert_true(tm[1] == m[1]);

    /* A step changes the worker's moments, not what was taken; a second take has the new ones. */
    fill(&b, 0, 3);
    zb_worker_step st = {0, 1.0f, 0, NULL, 0, 0, 0.0f};
    assert_int_equal(zb_worker_submit(w, &st), ZB_OK);
    expect_status(zb_worker_group_take_state(w, id, &taken, &tm, &tv, &n), ZB_EINVAL, "in flight");
    assert_int_equal(zb_worker_wait_result(w, 30000, NULL), ZB_OK);
    zb_worker_state_t *after = NULL;
    float *am = NULL, *av = NULL;
    assert_int_equal(zb_worker_group_take_state(w, id, &after, &am, &av, &n), ZB_OK);
    assert_int_equal(n, 42);
    assert_int_equal(zb_worker_group_get_state(w, id, m2, v2, NULL), ZB_OK);
    assert_memory_equal(am, m2, 4 * (size_t)N);
    assert_memory_equal(av, v2, 4 * (size_t)N);
    assert_true(memcmp(am, m, 4 * (size_t)N) != 0);
    assert_true(tm[0] == 123.0f && tm[2] == m[2] && tv[N - 1] == 456.0f && tv[0] == v[0]);

    expect_status(zb_worker_group_take_state(w, id, NULL, &tm, &tv, &n), ZB_EINVAL, "NULL");
    expect_status(zb_worker_group_take_state(w, id, &taken, NULL, &tv, &n), ZB_EINVAL, "NULL");
    expect_status(zb_worker_group_take_state(w, 7, &taken, &tm, &tv, &n), ZB_EINVAL,
                  "unknown group 7");
    expect_status(zb_worker_group_take_state(NULL, id, &taken, &tm, &tv, &n), ZB_EINVAL, "NULL");

    /* Still there once the worker is gone. */
    zb_worker_destroy(w);
    assert_memory_equal(am, m2, 4 * (size_t)N);
    assert_true(tm[3] == m[3]);
    zb_worker_state_release(taken);
    zb_worker_state_release(after);
    zb_worker_state_release(NULL);
    free(m);
    free(v);
    free(m2);
    free(v2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_per_group_counts),
        cmocka_unit_test(test_explicit_step),
        cmocka_unit_test(test_skip_nonfinite),
        cmocka_unit_test(test_grad_norm),
        cmocka_unit_test(test_clipping),
        cmocka_unit_test(test_state_arguments),
        cmocka_unit_test(test_step_ranges),
        cmocka_unit_test(test_remove_group),
        cmocka_unit_test(test_state_of_a_large_group),
        cmocka_unit_test(test_taken_state),
        cmocka_unit_test(test_death_during_a_state_transfer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
