/* A forked child of the trainer (a data-loader process, a user's multiprocessing fork) against the
 * real zenflow-optimizer: it reads the parameters as they were, its writes to parameters,
 * gradients and the control block stay its own, every call that would reach the parent's worker
 * is refused before anything is written, and destroying its copy of the handle leaves the worker
 * alone. Also what a fork costs with many segments, and that the child copies nothing it only
 * reads. */
#define _GNU_SOURCE
#include <zenbind/adam.h>
#include <zenbind/worker.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>

#include <cmocka.h>

#include "worker_case.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* lr 0.5, no weight decay: Adam's first step moves each parameter by 0.5 against its gradient's
 * sign, and leaves exp_avg at (1 - beta1) * grad. */
static unsigned add_group(zb_worker_t *w, size_t numel, zb_group_buffers *b) {
    zb_group_attr g = group_attr(numel, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0);
    g.hyper.lr = 0.5f;
    g.hyper.weight_decay = 0.0f;
    unsigned id = 99;
    zb_status st = zb_worker_group_add(w, &g, &id);
    if (st != ZB_OK) fail_msg("group_add: %s: %s", zb_status_name(st), zb_last_error());
    assert_int_equal(zb_worker_group_buffers(w, id, b), ZB_OK);
    return id;
}

static zb_status step(zb_worker_t *w, int64_t n) {
    zb_worker_step s = {n, 1.0f, 0, NULL, 0, 0, 0.0f};
    zb_status st = zb_worker_submit(w, &s);
    if (st != ZB_OK) return st;
    return zb_worker_wait_result(w, 10000, NULL);
}

/* The address range of the first mapping of this process whose /proc/self/maps line names `what`
 * ("memfd:zenflow control block"); 0 if none. */
static int find_mapping(const char *what, char **start, size_t *len) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, what) && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
            *start = (char *)lo;
            *len = hi - lo;
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* One field of /proc/self/status in kB, -1 if absent. */
static long self_status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    const size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            kb = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* In the child: a refused call, with the message naming the parent. Exit status `code` if not. */
static void expect_refused(zb_status st, pid_t parent, int code) {
    char want[96];
    snprintf(want, sizeof want, "belongs to process %d; a forked child", (int)parent);
    if (st != ZB_EINVAL || !strstr(zb_last_error(), want)) {
        fprintf(stderr, "child: got %s (%s), want ZB_EINVAL with \"%s\"\n", zb_status_name(st),
                zb_last_error(), want);
        _exit(code);
    }
}

enum { kNumel = 4096 };

/* What the child does; each failure has its own exit status. */
static void child_body(zb_worker_t *w, const zb_group_buffers *b, pid_t parent) {
    /* It reads the parameters and gradients as the parent left them. */
    for (size_t i = 0; i < kNumel; ++i)
        if (b->params[i] != (float)i || ((float *)b->grads[0])[i] != 1.0f) _exit(10);

    /* Its writes stay its own: parameters, both gradient buffers, and the whole control block
     * (found by its memfd's name, as nothing in the API hands it out). */
    for (size_t i = 0; i < kNumel; ++i) {
        b->params[i] = -1234.0f;
        ((float *)b->grads[0])[i] = 99.0f;
        ((float *)b->grads[1])[i] = 99.0f;
    }
    if (b->params[7] != -1234.0f) _exit(17);
    char *ctl;
    size_t len;
    if (!find_mapping("memfd:zenflow control block", &ctl, &len)) _exit(18);
    memset(ctl, 0xab, len);

    /* Every call that would reach the parent's worker is refused, and not by reading the control
     * block, which the child has just overwritten. */
    zb_worker_step s = {2, 1.0f, 0, NULL, 0, 0, 0.0f};
    expect_refused(zb_worker_submit(w, &s), parent, 11);
    expect_refused(zb_worker_wait_result(w, 100, NULL), parent, 12);
    zb_group_attr g = group_attr(16, ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0);
    unsigned id;
    expect_refused(zb_worker_group_add(w, &g, &id), parent, 13);
    static float m[kNumel], v[kNumel];
    expect_refused(zb_worker_group_set_state(w, 0, m, v, 7), parent, 14);
    int64_t count = -1;
    expect_refused(zb_worker_group_get_state(w, 0, m, v, &count), parent, 15);
    zb_worker_memory mem;
    expect_refused(zb_worker_memory_usage(w, &mem), parent, 16);

    /* Destroying its copy of the handle only forgets it: the parent's next step shows the worker
     * lives on. */
    if (zb_worker_destroy(w) != ZB_OK) _exit(19);
    _exit(0);
}

static void test_child_cannot_touch_the_parent(void **state) {
    (void)state;
    zb_worker_t *w = spawn_threads(1);
    zb_group_buffers b;
    add_group(w, kNumel, &b);
    for (size_t i = 0; i < kNumel; ++i) {
        b.params[i] = (float)i;
        ((float *)b.grads[0])[i] = 1.0f;
        ((float *)b.grads[1])[i] = 2.0f;
    }
    char *ctl;
    size_t len;
    assert_true(find_mapping("memfd:zenflow control block", &ctl, &len));
    unsigned char header[64];
    memcpy(header, ctl, sizeof header);

    const pid_t parent = getpid();
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) child_body(w, &b, parent);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);

    /* Nothing the child wrote reached the parent. */
    for (size_t i = 0; i < kNumel; ++i) {
        if (b.params[i] != (float)i || ((float *)b.grads[0])[i] != 1.0f ||
            ((float *)b.grads[1])[i] != 2.0f)
            fail_msg("element %zu: param %g grads %g %g after the child's writes", i,
                     (double)b.params[i], (double)((float *)b.grads[0])[i],
                     (double)((float *)b.grads[1])[i]);
    }
    assert_memory_equal(ctl, header, sizeof header);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child failed: %s %d (see child_body)",
                 WIFEXITED(status) ? "exit status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));

    /* The worker and its state are the parent's as before: the first step, from the parent's
     * gradients, with the step count the parent gives. */
    assert_int_equal(step(w, 1), ZB_OK);
    static float m[kNumel], v[kNumel];
    int64_t count = -1;
    assert_int_equal(zb_worker_group_get_state(w, 0, m, v, &count), ZB_OK);
    assert_int_equal(count, 1);
    for (size_t i = 0; i < kNumel; ++i) {
        if (fabsf(b.params[i] - ((float)i - 0.5f)) > 1e-3f * fmaxf(1.0f, (float)i) ||
            fabsf(m[i] - 0.1f) > 1e-6f)
            fail_msg("element %zu after the step: param %g, exp_avg %g", i, (double)b.params[i],
                     (double)m[i]);
    }
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

/* A child that forks again: the grandchild sees the child's own values, and neither reaches the
 * parent. */
static void test_grandchild(void **state) {
    (void)state;
    zb_worker_t *w = spawn_threads(1);
    zb_group_buffers b;
    add_group(w, 64, &b);
    b.params[0] = 1.0f;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        b.params[0] = 2.0f;
        pid_t grandchild = fork();
        if (grandchild < 0) _exit(30);
        if (grandchild == 0) {
            if (b.params[0] != 2.0f) _exit(1);
            b.params[0] = 3.0f;
            _exit(0);
        }
        int st;
        if (waitpid(grandchild, &st, 0) != grandchild || !WIFEXITED(st)) _exit(31);
        if (WEXITSTATUS(st) != 0) _exit(32 + WEXITSTATUS(st));
        _exit(b.params[0] == 2.0f ? 0 : 34);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(b.params[0] == 1.0f);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

/* The fastest of 20 fork + _exit + waitpid, in seconds. */
static double fastest_fork(void) {
    double fastest = 1e9;
    for (int i = 0; i < 20; ++i) {
        const double t0 = now_s();
        pid_t c = fork();
        if (c == 0) _exit(0);
        assert_int_equal(waitpid(c, NULL, 0), c);
        fastest = fmin(fastest, now_s() - t0);
    }
    return fastest;
}

/* The child pays a few system calls per segment, not a copy of the model: reading every
 * parameter leaves its private memory where it was, and one write copies one page. */
static void test_fork_cost_and_no_copy(void **state) {
    (void)state;
    enum { kGroups = 64 };
    const size_t numel = (size_t)1 << 18; /* 1 MiB of parameters, 3 MiB with both gradients */
    const double bare = fastest_fork();
    zb_worker_t *w = spawn_threads(1);
    zb_group_buffers b[kGroups];
    for (unsigned g = 0; g < kGroups; ++g) {
        add_group(w, numel, &b[g]);
        for (size_t i = 0; i < numel; i += 1024)
            b[g].params[i] = 1.0f; /* every page present in the parent */
    }
    const double with = fastest_fork();
    fprintf(stderr,
            "fork + exit + wait: %.3f ms without segments, %.3f ms with %d groups (%d MiB "
            "mapped)\n",
            bare * 1e3, with * 1e3, kGroups, kGroups * 3);

    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        const long before = self_status_kb("RssAnon");
        double sum = 0;
        for (unsigned g = 0; g < kGroups; ++g)
            for (size_t i = 0; i < numel; i += 1024)
                sum += b[g].params[i];
        const long after_read = self_status_kb("RssAnon");
        b[0].params[0] = 5.0f;
        const long after_write = self_status_kb("RssAnon");
        long out[3] = {after_read - before, after_write - after_read, (long)sum};
        _exit(write(pipefd[1], out, sizeof out) == (ssize_t)sizeof out ? 0 : 1);
    }
    close(pipefd[1]);
    long got[3];
    assert_int_equal(read(pipefd[0], got, sizeof got), sizeof got);
    close(pipefd[0]);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fprintf(stderr,
            "child RssAnon: +%ld kB after reading %d MiB of parameters, +%ld kB after one "
            "write\n",
            got[0], kGroups, got[1]);
    assert_int_equal(got[2], kGroups * (long)(numel / 1024));
    /* Not the 64 MiB it read, nor the 3 MiB segment it wrote to (RSS counters are approximate:
     * a margin, not one page). */
    assert_true(got[0] < 1024);
    assert_true(got[1] < 1024);
    assert_true(b[0].params[0] == 1.0f);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

/* A large state copy runs an OpenMP team in the trainer; libgomp's threads are gone in a child
 * forked after it, where a step of more than one thread (zb_adam_step: a data loader's process,
 * a checkpoint writer's) waited for them forever. It steps on one thread there. */
static void test_a_step_in_a_child_after_a_state_copy(void **state) {
    (void)state;
    zb_worker_t *w = spawn_threads(1);
    zb_group_buffers b;
    const size_t numel = (size_t)8 << 20; /* 32 MiB of each moment: copied by a team */
    const unsigned id = add_group(w, numel, &b);
    float *m = malloc(4 * numel), *v = malloc(4 * numel);
    assert_non_null(m);
    assert_non_null(v);
    assert_int_equal(zb_worker_group_get_state(w, id, m, v, NULL), ZB_OK);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
    free(m);
    free(v);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends the child by SIGALRM */
        enum { N = 1 << 16 };
        static float p[N], g[N], a[N], s[N];
        zb_adam_tensor t = {p, g, a, s, NULL, N, NULL, 0};
        zb_adam_args args;
        zb_adam_args_init(&args);
        args.threads = 2;
        _exit(zb_adam_step(&t, 1, &args, NULL) == ZB_OK ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status)) fail_msg("the child ended by signal %d", WTERMSIG(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_step_in_a_child_after_a_state_copy),
        cmocka_unit_test(test_child_cannot_touch_the_parent),
        cmocka_unit_test(test_grandchild),
        cmocka_unit_test(test_fork_cost_and_no_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
