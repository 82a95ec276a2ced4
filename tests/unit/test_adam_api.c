/* zb_adam_step, the in-process step: the same bits as a worker step with the same arguments (the
 * worker of this build tree is the reference), on any thread count and in the caller's OpenMP
 * team; skipping, clipping and per-tensor hyperparameters; arguments refused before anything is
 * written. zb_adam_grad_stats: the step's pre-pass alone, the same bits. */
#define _GNU_SOURCE /* gettid */
#include <zenbind/adam.h>

#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { N0 = 70001, N1 = 4099, N = N0 + N1, STEPS = 4 };

/* Two tensors' streams laid end to end, as a worker group lays them out. */
typedef struct {
    float param[N], m[N], v[N];
    uint16_t copy[N];
} streams;

static float grad_at(int step, size_t i) {
    /* deterministic, varied, signs and magnitudes */
    const uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(step * 40503u);
    return ((float)(x % 20001u) - 10000.0f) * 1e-5f;
}

static void fill_start(float *param) {
    for (size_t i = 0; i < N; ++i)
        param[i] = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
}

static zb_adam_hyper hyper_b(void) {
    zb_adam_hyper h;
    zb_adam_hyper_init(&h);
    h.lr = 3e-3f;
    h.weight_decay = 0.1f;
    h.adamw = 0; /* Adam with L2 for the second tensor */
    return h;
}

static void tensors_of(streams *s, const float *grad, zb_adam_tensor t[2], const zb_adam_hyper *h1,
                       int copy) {
    memset(t, 0, 2 * sizeof *t);
    const size_t off[2] = {0, N0}, n[2] = {N0, N1};
    for (int k = 0; k < 2; ++k) {
        t[k].param = s->param + off[k];
        t[k].grad = grad + off[k];
        t[k].exp_avg = s->m + off[k];
        t[k].exp_avg_sq = s->v + off[k];
        t[k].copy_out = copy ? (void *)(s->copy + off[k]) : NULL;
        t[k].numel = n[k];
    }
    t[1].hyper = h1;
}

static zb_adam_args args_for(int step, int threads, unsigned flags, float max_norm, int copy) {
    zb_adam_args a;
    zb_adam_args_init(&a);
    a.step = step;
    a.threads = threads;
    a.flags = flags;
    a.max_grad_norm = max_norm;
    a.copy_out = copy ? ZB_DTYPE_BF16 : ZB_DTYPE_NONE;
    a.grad_scale = 0.5f;
    return a;
}

/* STEPS steps in process; threads as zb_adam_args.threads (ZB_ADAM_TEAM: a team of 3 of ours). */
static void run_in_process(streams *s, int threads, unsigned flags, float max_norm, int copy,
                           zb_worker_result *last) {
    static float grad[N];
    const zb_adam_hyper h1 = hyper_b();
    memset(s, 0, sizeof *s);
    fill_start(s->param);
    for (int step = 1; step <= STEPS; ++step) {
        for (size_t i = 0; i < N; ++i)
            grad[i] = grad_at(step, i);
        zb_adam_tensor t[2];
        tensors_of(s, grad, t, &h1, copy);
        zb_adam_args a = args_for(step, threads, flags, max_norm, copy);
        if (step % 2) { /* the tensors' own step numbers win over args.step */
            t[0].step = t[1].step = step;
            a.step = 1000;
        }
        zb_status st = ZB_OK;
        if (threads == ZB_ADAM_TEAM) {
            zb_status per[3] = {ZB_OK, ZB_OK, ZB_OK};
            zb_worker_result r[3];
#pragma omp parallel num_threads(3)
            per[omp_get_thread_num()] = zb_adam_step(t, 2, &a, &r[omp_get_thread_num()]);
            for (int k = 0; k < 3; ++k) {
                assert_int_equal(per[k], ZB_OK);
                assert_memory_equal(&r[k].nonfinite, &r[0].nonfinite, sizeof r[0].nonfinite);
                assert_int_equal(r[k].skipped, r[0].skipped);
            }
            *last = r[0];
        } else {
            st = zb_adam_step(t, 2, &a, last);
        }
        if (st != ZB_OK) fail_msg("zb_adam_step: %s", zb_last_error());
    }
}

/* The same steps through a worker: one group per tensor, as the in-process call has two tensors
 * with their own hyperparameters. */
static void run_in_worker(streams *s, unsigned flags, float max_norm, int copy,
                          zb_worker_result *last) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 2;
    zb_worker_t *w = NULL;
    if (zb_worker_spawn(&attr, 0, &w) != ZB_OK) fail_msg("spawn: %s", zb_last_error());
    zb_group_buffers b[2];
    const size_t n[2] = {N0, N1}, off[2] = {0, N0};
    memset(s, 0, sizeof *s);
    fill_start(s->param);
    for (unsigned g = 0; g < 2; ++g) {
        zb_group_attr ga;
        memset(&ga, 0, sizeof ga);
        ga.numel = n[g];
        ga.grad = ZB_DTYPE_FP32;
        ga.copy_out = copy ? ZB_DTYPE_BF16 : ZB_DTYPE_NONE;
        if (g == 0)
            zb_adam_hyper_init(&ga.hyper);
        else
            ga.hyper = hyper_b();
        unsigned id;
        assert_int_equal(zb_worker_group_add(w, &ga, &id), ZB_OK);
        assert_int_equal(zb_worker_group_buffers(w, id, &b[g]), ZB_OK);
        memcpy(b[g].params, s->param + off[g], n[g] * 4);
    }
    for (int step = 1; step <= STEPS; ++step) {
        for (unsigned g = 0; g < 2; ++g)
            for (size_t i = 0; i < n[g]; ++i)
                ((float *)b[g].grads[0])[i] = grad_at(step, off[g] + i);
        zb_worker_step ws;
        memset(&ws, 0, sizeof ws);
        ws.step = step;
        ws.grad_scale = 0.5f;
        ws.flags = flags;
        ws.max_grad_norm = max_norm;
        assert_int_equal(zb_worker_submit(w, &ws), ZB_OK);
        assert_int_equal(zb_worker_wait_result(w, 60000, last), ZB_OK);
    }
    for (unsigned g = 0; g < 2; ++g) {
        memcpy(s->param + off[g], b[g].params, n[g] * 4);
        if (copy) memcpy(s->copy + off[g], b[g].copy_out, n[g] * 2);
        int64_t count;
        assert_int_equal(zb_worker_group_get_state(w, g, s->m + off[g], s->v + off[g], &count),
                         ZB_OK);
    }
    zb_worker_destroy(w);
}

static streams ref, got;

static void same_bits(const streams *a, const streams *b, int copy) {
    assert_memory_equal(a->param, b->param, sizeof a->param);
    assert_memory_equal(a->m, b->m, sizeof a->m);
    assert_memory_equal(a->v, b->v, sizeof a->v);
    if (copy) assert_memory_equal(a->copy, b->copy, sizeof a->copy);
}

static void test_same_bits_as_a_worker_on_any_threads(void **state) {
    (void)state;
    zb_worker_result wr, r;
    run_in_worker(&ref, 0, 0.0f, 1, &wr);
    const int threads[] = {1, 2, 3, 0, ZB_ADAM_TEAM};
    for (size_t k = 0; k < sizeof threads / sizeof *threads; ++k) {
        run_in_process(&got, threads[k], 0, 0.0f, 1, &r);
        same_bits(&ref, &got, 1);
        assert_int_equal(r.skipped, 0);
        assert_true(r.seconds > 0);
    }
    /* and the steps moved the parameters */
    float start[N];
    fill_start(start);
    assert_true(memcmp(start, got.param, sizeof start) != 0);
}

static void test_clipping_and_the_norm_as_a_worker(void **state) {
    (void)state;
    zb_worker_result wr, r;
    run_in_worker(&ref, ZB_STEP_GRAD_NORM, 0.05f, 0, &wr);
    run_in_process(&got, 2, ZB_STEP_GRAD_NORM, 0.05f, 0, &r);
    same_bits(&ref, &got, 0);
    assert_memory_equal(&r.grad_norm, &wr.grad_norm, sizeof r.grad_norm);
    assert_true(r.grad_norm > 0.05);
    /* clipping changed the result: without it the bits differ */
    run_in_process(&got, 2, 0, 0.0f, 0, &r);
    assert_true(memcmp(ref.param, got.param, sizeof ref.param) != 0);
}

static void test_a_nonfinite_gradient_skips_and_writes_nothing(void **state) {
    (void)state;
    static float grad[N];
    for (size_t i = 0; i < N; ++i)
        grad[i] = grad_at(1, i);
    grad[N - 3] = INFINITY; /* in the second tensor only */
    memset(&got, 0, sizeof got);
    fill_start(got.param);
    static streams before;
    before = got;
    zb_adam_tensor t[2];
    const zb_adam_hyper h1 = hyper_b();
    tensors_of(&got, grad, t, &h1, 1);
    zb_adam_args a = args_for(1, 2, ZB_STEP_SKIP_NONFINITE, 0.0f, 1);
    zb_worker_result r;
    assert_int_equal(zb_adam_step(t, 2, &a, &r), ZB_OK);
    assert_int_equal(r.skipped, 1);
    assert_int_equal(r.nonfinite, 1);
    assert_memory_equal(&got, &before, sizeof got);
    /* without the flag the step is applied (as torch does) and the element counted */
    a.flags = 0;
    assert_int_equal(zb_adam_step(t, 2, &a, &r), ZB_OK);
    assert_int_equal(r.skipped, 0);
    assert_int_equal(r.nonfinite, 1);
    assert_true(memcmp(&got, &before, sizeof got) != 0);
}

/* This thread's floating-point mode made non-IEEE (flush-to-zero, denormals-are-zero where the
 * CPU has it, rounding upwards: what torch.set_flush_denormal(True) or fesetround() leave in a
 * caller's threads), or back to IEEE; -1 where this test does not know the CPU's control
 * register. is_odd(): whether this thread's mode is that non-IEEE one now, read from the
 * register itself (on x86-64 fegetround() reads the x87 control word, not MXCSR). */
#if defined(__x86_64__)
static const unsigned odd_bits = 0x8040u | 0x2000u; /* MXCSR FTZ | DAZ, RC = upwards */
static int is_odd(void) {
    return (_mm_getcsr() & 0xE040u) == odd_bits;
}
static int odd_float_mode(int on) {
    _mm_setcsr((_mm_getcsr() & ~0xE040u) | (on ? odd_bits : 0));
    return is_odd() == on;
}
#elif defined(__aarch64__)
static uint64_t fpcr(void) {
    uint64_t v;
    __asm__ volatile("mrs %0, fpcr" : "=r"(v));
    return v;
}
static const uint64_t odd_bits = (UINT64_C(1) << 24) | (UINT64_C(1) << 22); /* FZ, RMode = RP */
static int is_odd(void) {
    return (fpcr() & ((UINT64_C(1) << 24) | (UINT64_C(3) << 22))) == odd_bits;
}
static int odd_float_mode(int on) {
    const uint64_t v =
        (fpcr() & ~((UINT64_C(1) << 24) | (UINT64_C(3) << 22))) | (on ? odd_bits : 0);
    __asm__ volatile("msr fpcr, %0" : : "r"(v));
    return is_odd() == on;
}
#else
static int is_odd(void) {
    return 0;
}
static int odd_float_mode(int on) {
    (void)on;
    return -1;
}
#endif

/* The step's bits are the same whatever mode the calling threads hold (the kernels set round to
 * nearest with denormals kept, as torch computes by default), in a team of the library's and
 * in the caller's own, and each thread's mode is back afterwards. Gradients of 1e-21 make
 * denormal squares, which a flushing or upward-rounding thread changed. */
static void test_the_callers_float_mode_is_not_the_steps(void **state) {
    (void)state;
    if (odd_float_mode(0) < 0) skip();
    static float grad[N];
    for (size_t i = 0; i < N; ++i)
        grad[i] = grad_at(1, i) * 1e-20f;
    const zb_adam_hyper h1 = hyper_b();
    static streams want;
    for (int run = 0; run < 3; ++run) {
        memset(&got, 0, sizeof got);
        fill_start(got.param);
        zb_adam_tensor t[2];
        tensors_of(&got, grad, t, &h1, 1);
        zb_adam_args a = args_for(1, 2, 0, 0.0f, 1);
        int odd = 1, restored = 1;
        zb_status st[2] = {ZB_OK, ZB_OK};
        if (run == 0) { /* the reference, every thread as a process starts */
            assert_int_equal(zb_adam_step(t, 2, &a, NULL), ZB_OK);
            want = got;
            continue;
        }
        if (run == 1) {
            /* the library's team: OpenMP's pool threads, made odd here (those a later region
             * runs on again are checked: OpenMP need not reuse them, libomp may not) */
            pid_t made[2] = {0, 0};
#pragma omp parallel num_threads(2) reduction(& : odd)
            {
                odd &= odd_float_mode(1);
                made[omp_get_thread_num()] = gettid();
            }
            odd &= odd_float_mode(1);
            st[0] = zb_adam_step(t, 2, &a, NULL);
            restored = is_odd();
#pragma omp parallel num_threads(2) reduction(& : restored)
            if (gettid() == made[0] || gettid() == made[1]) restored &= is_odd();
        } else { /* the caller's own team */
            a.threads = ZB_ADAM_TEAM;
#pragma omp parallel num_threads(2) reduction(& : odd, restored)
            {
                odd &= odd_float_mode(1);
                st[omp_get_thread_num()] = zb_adam_step(t, 2, &a, NULL);
                restored &= is_odd();
            }
        }
#pragma omp parallel num_threads(2)
        odd_float_mode(0);
        odd_float_mode(0);
        assert_true(odd);
        assert_int_equal(st[0], ZB_OK);
        assert_int_equal(st[1], ZB_OK);
        assert_true(restored);
        assert_memory_equal(&got, &want, sizeof got);
    }
}

static void expect_refused(const zb_adam_tensor *t, size_t count, const zb_adam_args *a,
                           const char *needle) {
    static streams before;
    before = got;
    const zb_status st = zb_adam_step(t, count, a, NULL);
    assert_int_equal(st, ZB_EINVAL);
    if (!strstr(zb_last_error(), needle)) fail_msg("'%s' lacks '%s'", zb_last_error(), needle);
    assert_memory_equal(&got, &before, sizeof got);
}

/* zb_adam_hyper_check: torch's ranges, the first value out of range named with what it was. */
static void test_the_hyperparameters_one_check(void **state) {
    (void)state;
    zb_adam_hyper h;
    zb_adam_hyper_init(&h);
    assert_int_equal(zb_adam_hyper_check(&h), ZB_OK);
    h.lr = 0.0f; /* lr 0, eps 0, weight_decay 0 and beta 0 are allowed, as in torch */
    h.eps = 0.0f;
    h.weight_decay = 0.0f;
    h.beta1 = 0.0f;
    assert_int_equal(zb_adam_hyper_check(&h), ZB_OK);
    static const struct {
        int field;
        float value;
        const char *message;
    } bad[] = {
        {0, -1.0f, "lr must be finite and >= 0 (got -1)"},
        {0, INFINITY, "lr must be finite and >= 0 (got inf)"},
        {1, 1.0f, "beta1 and beta2 must be in [0, 1) (got 1, 0.999)"},
        {2, NAN, "beta1 and beta2 must be in [0, 1) (got 0.9, nan)"},
        {3, -1e-8f, "eps must be finite and >= 0 (got -1e-08)"},
        {4, -0.5f, "weight_decay must be finite and >= 0 (got -0.5)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        zb_adam_hyper_init(&h);
        float *field[] = {&h.lr, &h.beta1, &h.beta2, &h.eps, &h.weight_decay};
        *field[bad[i].field] = bad[i].value;
        assert_int_equal(zb_adam_hyper_check(&h), ZB_EINVAL);
        assert_non_null(strstr(zb_last_error(), bad[i].message));
    }
    zb_adam_hyper_init(&h);
    h.adamw = 2;
    assert_int_equal(zb_adam_hyper_check(&h), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "adamw and bias_correction must be 0 or 1 (got 2, 1)"));
    assert_int_equal(zb_adam_hyper_check(NULL), ZB_EINVAL);
}

static void test_bad_arguments_change_nothing(void **state) {
    (void)state;
    static float grad[N];
    memset(&got, 0, sizeof got);
    fill_start(got.param);
    zb_adam_tensor t[2];
    zb_adam_hyper h1 = hyper_b();
    tensors_of(&got, grad, t, &h1, 0);
    zb_adam_args a = args_for(1, 1, 0, 0.0f, 0);
    expect_refused(t, 2, NULL, "args is NULL");
    expect_refused(NULL, 2, &a, "tensors is NULL");
    zb_adam_args b = a;
    assert_int_equal(a.size, sizeof a); /* zb_adam_args_init */
    const size_t smaller[] = {0, 8, offsetof(zb_adam_args, threads), sizeof b - 1};
    for (size_t i = 0; i < sizeof smaller / sizeof *smaller; ++i) {
        b.size = smaller[i];
        expect_refused(t, 2, &b, "zb_adam_args_init");
    }
    b = a;
    b.step = 0;
    expect_refused(t, 2, &b, "step must be >= 1");
    b = a;
    b.flags = 0x80;
    expect_refused(t, 2, &b, "unknown flags");
    b = a;
    b.max_grad_norm = -1.0f;
    expect_refused(t, 2, &b, "max_grad_norm");
    b = a;
    b.grad = ZB_DTYPE_NONE;
    expect_refused(t, 2, &b, "grad must be");
    b = a;
    b.copy_out = ZB_DTYPE_BF16; /* but no copy_out pointers */
    expect_refused(t, 2, &b, "tensor 0: copy_out is NULL");
    b = a;
    b.threads = ZB_ADAM_TEAM; /* outside any parallel region */
    expect_refused(t, 2, &b, "outside an OpenMP parallel region");
    b.threads = ZB_ADAM_MAX_THREADS + 1; /* libgomp would try to make them all, and crash */
    expect_refused(t, 2, &b, "threads must be 1 to 1024");
    b.threads = -2;
    expect_refused(t, 2, &b, "not -2");
    h1.beta2 = 1.0f; /* the second tensor's own hyperparameters, checked before the first */
    expect_refused(t, 2, &a, "tensor 1: hyper: beta1 and beta2");
    h1 = hyper_b();
    t[1].step = -1;
    expect_refused(t, 2, &a, "tensor 1: step must be >= 1");
    t[1].step = 0;
    t[1].exp_avg = NULL;
    expect_refused(t, 2, &a, "tensor 1: param, grad, exp_avg");
    t[1].exp_avg = t[0].exp_avg;
    /* numel no buffer holds, or whose sum wraps (which stepped part of tensor 0, or nothing) */
    t[1].numel = SIZE_MAX;
    expect_refused(t, 2, &a, "tensor 1: numel 18446744073709551615 is more than a buffer");
    t[1].numel = (size_t)PTRDIFF_MAX / sizeof(float) - N0 + 1;
    expect_refused(t, 2, &a, "brings the tensors' total past");
    t[1].numel = 0; /* an empty tensor needs no streams */
    assert_int_equal(zb_adam_step(t, 2, &a, NULL), ZB_OK);
    assert_int_equal(zb_adam_step(NULL, 0, &a, NULL), ZB_OK);
}

/* A forked child of a process that stepped on a team of threads: libgomp's threads are gone in
 * it, and a region of more than one waited for them forever. The child steps on one thread,
 * the same bits as the parent's team. */
static void test_a_forked_child_steps_on_one_thread(void **state) {
    (void)state;
    static streams team, child;
    static float grad[N];
    for (size_t i = 0; i < N; ++i)
        grad[i] = grad_at(1, i);
    memset(&team, 0, sizeof team);
    fill_start(team.param);
    child = team;
    zb_adam_tensor t[2];
    zb_adam_hyper h1 = hyper_b();
    tensors_of(&team, grad, t, &h1, 0);
    const zb_adam_args a = args_for(1, 3, 0, 0.0f, 0);
    assert_int_equal(zb_adam_step(t, 2, &a, NULL), ZB_OK); /* the parent's team of 3 */
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends the child by SIGALRM */
        tensors_of(&child, grad, t, &h1, 0);
        const int ok =
            zb_adam_step(t, 2, &a, NULL) == ZB_OK && memcmp(&child, &team, sizeof child) == 0;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status)) fail_msg("the child ended by signal %d", WTERMSIG(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* zb_adam_grad_stats over gradients alone (no other stream) finds what a step's pre-pass finds,
 * to the bit, on any thread count and in the caller's team. */
static void test_grad_stats_alone_as_a_step_finds(void **state) {
    (void)state;
    static float grad[N];
    for (size_t i = 0; i < N; ++i)
        grad[i] = grad_at(3, i);
    grad[7] = INFINITY;
    grad[N - 2] = NAN;
    zb_adam_tensor t[2];
    const zb_adam_hyper h1 = hyper_b();
    memset(&got, 0, sizeof got);
    tensors_of(&got, grad, t, &h1, 0);
    zb_adam_args a = args_for(1, 2, ZB_STEP_GRAD_NORM | ZB_STEP_SKIP_NONFINITE, 0.0f, 0);
    zb_worker_result step;
    assert_int_equal(zb_adam_step(t, 2, &a, &step), ZB_OK);
    assert_int_equal(step.skipped, 1);
    zb_adam_tensor only[2];
    memset(only, 0, sizeof only);
    for (int k = 0; k < 2; ++k) {
        only[k].grad = t[k].grad;
        only[k].numel = t[k].numel;
        only[k].hyper = (const zb_adam_hyper *)(uintptr_t)8; /* not read: a fault if it were */
        only[k].step = -1;                                   /* nor checked */
    }
    grad[7] = grad[N - 2] = 1.0f; /* and a finite norm to compare */
    zb_worker_result finite;
    assert_int_equal(zb_adam_step(t, 2, &a, &finite), ZB_OK);
    assert_true(finite.grad_norm > 0);
    const int threads[] = {1, 2, 3, 0, ZB_ADAM_TEAM};
    for (size_t i = 0; i < sizeof threads / sizeof *threads; ++i) {
        zb_adam_args b = args_for(1, threads[i], 0, 0.0f, 0);
        zb_grad_stats s[3];
        for (int pass = 0; pass < 2; ++pass) {
            grad[7] = pass ? 1.0f : INFINITY;
            grad[N - 2] = pass ? 1.0f : NAN;
            memset(s, 0, sizeof s);
            if (threads[i] == ZB_ADAM_TEAM) {
                zb_status per[3] = {ZB_OK, ZB_OK, ZB_OK};
#pragma omp parallel num_threads(3)
                per[omp_get_thread_num()] =
                    zb_adam_grad_stats(only, 2, &b, &s[omp_get_thread_num()]);
                for (int k = 0; k < 3; ++k) {
                    assert_int_equal(per[k], ZB_OK);
                    assert_memory_equal(&s[k], &s[0], sizeof s[0]);
                }
            } else {
                assert_int_equal(zb_adam_grad_stats(only, 2, &b, &s[0]), ZB_OK);
            }
            const zb_worker_result *want = pass ? &finite : &step;
            assert_int_equal(s[0].nonfinite, want->nonfinite);
            const double norm = sqrt(s[0].sum_squares);
            assert_memory_equal(&norm, &want->grad_norm, sizeof norm);
        }
    }
    /* refused: what it reads, and where it writes */
    zb_grad_stats s;
    assert_int_equal(zb_adam_grad_stats(only, 2, &a, NULL), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "zb_adam_grad_stats: out is NULL"));
    only[1].grad = NULL;
    assert_int_equal(zb_adam_grad_stats(only, 2, &a, &s), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "tensor 1: grad must not be NULL"));
    only[1].numel = 0;
    assert_int_equal(zb_adam_grad_stats(only, 2, &a, &s), ZB_OK);
    a.grad = ZB_DTYPE_NONE;
    assert_int_equal(zb_adam_grad_stats(only, 2, &a, &s), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "zb_adam_grad_stats: grad must be"));
    a = args_for(1, ZB_ADAM_TEAM, 0, 0.0f, 0);
    assert_int_equal(zb_adam_grad_stats(only, 2, &a, &s), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "outside an OpenMP parallel region"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_a_worker_on_any_threads),
        cmocka_unit_test(test_clipping_and_the_norm_as_a_worker),
        cmocka_unit_test(test_a_nonfinite_gradient_skips_and_writes_nothing),
        cmocka_unit_test(test_the_callers_float_mode_is_not_the_steps),
        cmocka_unit_test(test_bad_arguments_change_nothing),
        cmocka_unit_test(test_the_hyperparameters_one_check),
        cmocka_unit_test(test_grad_stats_alone_as_a_step_finds),
        cmocka_unit_test(test_a_forked_child_steps_on_one_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
