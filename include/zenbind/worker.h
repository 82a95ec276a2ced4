/* worker.h: the optimizer worker API of libzenbind.
 *
 * A training process spawns one zenflow-optimizer worker, registers its parameter groups in shared
 * memory, and then, every step, fills a gradient buffer, submits the step and later waits for it.
 * The worker runs one pinned OpenMP thread per optimizer CPU and owns the Adam moments, allocated
 * on the optimizer's NUMA nodes when a group is registered. See libzenbind(3), section WORKER API.
 *
 * Conventions are those of <zenbind/zenbind.h>: every call returns a zb_status with a message in
 * zb_last_error(); none aborts; every wait is bounded. A dead worker gives ZB_EDEAD with how it
 * died; a worker of another shared-memory layout version gives ZB_EVERSION.
 *
 * One worker handle is used by one thread at a time (calls on the same handle are not
 * synchronised); distinct handles are independent.
 */
#ifndef ZENBIND_WORKER_H
#define ZENBIND_WORKER_H

#include <zenbind/zenbind.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zb_worker zb_worker_t;

/* Element types of gradients and of the optional copy-out of the updated parameters. */
typedef enum zb_dtype {
    ZB_DTYPE_NONE = 0, /* copy-out only: no copy */
    ZB_DTYPE_FP32 = 1, /* gradients only */
    ZB_DTYPE_BF16 = 2,
    ZB_DTYPE_FP16 = 3
} zb_dtype;

/* Upper bounds of the shared-memory layout. ZB_WORKER_MAX_GROUPS was 256 up to zenflow-bind
 * 0.6.0; zb_worker_group_add says when a worker has no room left. */
#define ZB_WORKER_MAX_GROUPS 4096
#define ZB_WORKER_MAX_THREADS 1024
#define ZB_WORKER_MAX_NODES 64

/* How to spawn the worker. zb_worker_attr_init() fills the defaults; fields left at 0 / NULL /
 * "" keep them, except the spins, where 0 means no spinning. The strings are the caller's, read
 * during zb_worker_spawn() only. */
typedef struct zb_worker_attr {
    size_t size; /* sizeof(zb_worker_attr) as the caller was compiled: zb_worker_attr_init() */
    /* Executable; NULL or "" means $ZENFLOW_OPTIMIZER, else
     * <libexecdir>/zenflow-bind/zenflow-optimizer. */
    const char *path;
    /* Optimizer CPUs, a cpu-list; NULL or "" means $ZENFLOW_OPT_CPUS, else every CPU the caller may
     * run on (its affinity; where OpenMP binds threads, the CPUs of its places). One thread is
     * pinned per CPU, in increasing order, cycling if there are more threads than CPUs. */
    const char *cpus;
    /* Thread count; 0 means $ZENFLOW_OPT_THREADS, else one per optimizer CPU. */
    unsigned threads;
    /* NUMA nodes for the worker's memory (Adam moments and the shared buffers), a node list; NULL
     * or "" means $ZENFLOW_OPT_MEMS, else the nodes of the optimizer CPUs. Preferred, not strict: a
     * full node spills to others instead of killing the job. */
    const char *mems;
    /* Busy-wait before sleeping on a futex, in microseconds: the worker's wait for a command and
     * zb_worker_wait_result's wait for a result. Default 50 each, 0 for none, at most 50000 (the
     * worker checks that its trainer lives between spins); longer trades CPU for latency. */
    unsigned worker_spin_us;
    unsigned wait_spin_us;
    /* Bound on spawn and group registration (which allocates and zeroes the moments), in ms.
     * Default 60000. A registration past it stops the worker (ZB_ETIMEDOUT, then ZB_EDEAD). */
    unsigned control_timeout_ms;
} zb_worker_attr;

/* Every field to its default, `size` to `size`. */
void zb_worker_attr_init_size(zb_worker_attr *attr, size_t size);
static inline void zb_worker_attr_init(zb_worker_attr *attr) {
    zb_worker_attr_init_size(attr, sizeof *attr);
}

/* Start a worker and wait (bounded by control_timeout_ms) until its threads are pinned and it
 * has checked the shared-memory header. attr NULL means all defaults. ZB_ENOMEM if the shared
 * memory cannot be reserved (memory limit, file size limit); ZB_EVERSION if the executable speaks
 * another layout version; ZB_EDEAD if it died while starting; ZB_EINVAL for a bad cpu/node list, an
 * attr not filled by zb_worker_attr_init() or flags other than 0. */
zb_status zb_worker_spawn(const zb_worker_attr *attr, unsigned long flags, zb_worker_t **out);

/* Ask the worker to exit, wait for it (bounded by control_timeout_ms, then SIGKILL; a worker
 * stopped by a signal, which cannot answer, is killed at once; one stopped under a debugger is
 * killed too, and collected once the debugger lets it go), unmap and free everything. NULL is a
 * no-op. Returns ZB_OK even if the worker had died; the handle is freed in every case. */
zb_status zb_worker_destroy(zb_worker_t *worker);

/* End the worker process as zb_worker_destroy() does (its moments go with it), but keep the
 * handle and the trainer's mappings of the shared buffers: the pointers zb_worker_group_buffers()
 * gave stay readable, with the last values, until zb_worker_destroy(). For a caller that cannot
 * tell whether views of the buffers are still in use. Calls that need the worker then fail with
 * ZB_EDEAD; a second stop is ZB_OK; ZB_EINVAL in a forked child. (ZENBIND_2.1) */
zb_status zb_worker_stop(zb_worker_t *worker);

/* Adam/AdamW hyperparameters of one parameter group (torch.optim semantics; eps added after bias
 * correction). */
typedef struct zb_adam_hyper {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    int adamw;           /* 1: decoupled weight decay (AdamW); 0: L2 added to the gradient (Adam) */
    int bias_correction; /* 1 (torch's behaviour) or 0 */
} zb_adam_hyper;

/* torch.optim.AdamW's defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 1e-2. */
void zb_adam_hyper_init(zb_adam_hyper *hyper);
/* ZB_OK if every call that takes a zb_adam_hyper accepts it (torch.optim.AdamW's ranges: lr, eps
 * and weight_decay finite and >= 0, betas in [0, 1), adamw and bias_correction 0 or 1), else
 * ZB_EINVAL naming the first value out of range. The one check: bindings call it instead of
 * restating it. Since ZENBIND_0.5. */
zb_status zb_adam_hyper_check(const zb_adam_hyper *hyper);

/* zb_group_attr.flags */
/* Keep an fp32 snapshot of the updated parameters (the former `stale = 1`). */
#define ZB_GROUP_STALE 0x1u
/* One gradient buffer, not two (since 0.5): a trainer that never fills a buffer while a step
 * reads the other saves dtype size bytes per parameter; zb_group_buffers.grads[1] is NULL and a
 * step that reads buffer 1 is refused. A library before 0.5 refuses the flag (ZB_EINVAL). */
#define ZB_GROUP_ONE_GRAD_BUFFER 0x2u

/* A parameter group to register. */
typedef struct zb_group_attr {
    size_t numel;  /* parameters in the group, >= 1 */
    zb_dtype grad; /* FP32, BF16 or FP16; two buffers of it, or one (ZB_GROUP_ONE_GRAD_BUFFER) */
    zb_dtype copy_out; /* NONE, BF16 or FP16: the updated parameters, converted */
    union {            /* one int: 0.4's `stale` is flags' ZB_GROUP_STALE bit */
        int stale;
        unsigned flags; /* ZB_GROUP_* */
    };
    zb_adam_hyper hyper;
} zb_group_attr;

/* Reserve the group's shared memory (params, 2 or 1 gradient buffers, copy-out, stale), hand it to
 * the worker, which allocates and zeroes the Adam moments with its pinned threads. The new group's
 * id (0, 1, ... in registration order) goes to *group. Parameters start at 0: fill them through
 * zb_worker_group_buffers() before the first step. Not allowed while a step is in flight. */
zb_status zb_worker_group_add(zb_worker_t *worker, const zb_group_attr *attr, unsigned *group);

/* Remove the newest group (the last added, `group` the id it got), as if it had not been added:
 * the worker unmaps its shared memory and frees its moments, the trainer unmaps its buffers (the
 * pointers zb_worker_group_buffers gave are invalid from then on), and the next group added gets
 * its id. For a caller undoing registrations that a later failure of its own made useless; groups
 * go newest first (any other is ZB_EINVAL). Not allowed while a step is in flight; ZB_EDEAD once
 * the worker died (it holds nothing then). (ZENBIND_2.1) */
zb_status zb_worker_group_remove(zb_worker_t *worker, unsigned group);

/* Pointers into the shared memory of a group, valid until zb_worker_destroy() or the group's
 * removal. The trainer writes params (before the first step) and grads[k]; it reads params,
 * copy_out and stale after zb_worker_wait_result(). While a step that reads grads[k] is in
 * flight, the trainer may fill grads[1-k] but must not touch params, copy_out, stale or grads[k].
 */
typedef struct zb_group_buffers {
    size_t numel;
    float *params;
    void *grads[2]; /* grads[1] NULL with ZB_GROUP_ONE_GRAD_BUFFER */
    void *copy_out; /* NULL if the group has none */
    float *stale;   /* NULL if the group has none */
    zb_dtype grad;
    zb_dtype copy;
} zb_group_buffers;

zb_status zb_worker_group_buffers(zb_worker_t *worker, unsigned group, zb_group_buffers *out);

/* zb_worker_step.flags */
/* GradScaler semantics: if any gradient element of any group is not finite after grad_scale,
 * nothing is written (params, moments, copy-out, stale and step counts stay as they were) and the
 * result says skipped. */
#define ZB_STEP_SKIP_NONFINITE 0x1u
/* Compute the global L2 norm of the scaled gradients (zb_worker_result.grad_norm). */
#define ZB_STEP_GRAD_NORM 0x2u

/* One optimizer step over every registered group. */
typedef struct zb_worker_step {
    /* 0: each group uses its own step count + 1 (a group added later starts at 1, as in torch);
     * >= 1: every group uses this number, which becomes each group's count. For bias correction. */
    int64_t step;
    float grad_scale;            /* multiplies every gradient (e.g. 1/loss_scale) */
    unsigned grad_buffer;        /* 0 or 1: which gradient buffer the step reads */
    const zb_adam_hyper *hypers; /* NULL: each group's current hyperparameters; else one per group
                                    (nhypers == number of groups); they become current */
    size_t nhypers;
    unsigned flags; /* ZB_STEP_*; 0 for a plain step */
    /* > 0: clip by the global norm as torch.nn.utils.clip_grad_norm_ does: the gradients are
     * multiplied by min(1, max_grad_norm / (norm + 1e-6)) in the same update pass (norm of the
     * scaled gradients over every group); implies ZB_STEP_GRAD_NORM. 0: no clipping. */
    float max_grad_norm;
} zb_worker_step;

/* Start a step and return without waiting. ZB_EINVAL if a step is already in flight, grad_buffer
 * > 1 or 1 over a group with ZB_GROUP_ONE_GRAD_BUFFER, step < 0, unknown flags, max_grad_norm
 * negative or not finite, or nhypers does not match. A step with no group registered is allowed: it
 * does no work and measures the control round trip. ZB_EDEAD if the worker has died. A step with
 * step == 0 fails at the wait with ZB_EINVAL, writing nothing, if a group's count is already
 * INT64_MAX. */
zb_status zb_worker_submit(zb_worker_t *worker, const zb_worker_step *step);

/* zb_worker_submit over groups first .. first + count - 1 only (count >= 1), e.g. a bucket whose
 * gradients have all landed while backward goes on; hypers, when given, has count entries. Each
 * group of the range takes its step number as zb_worker_submit would; the others are untouched.
 * ZB_STEP_SKIP_NONFINITE, ZB_STEP_GRAD_NORM and max_grad_norm look at these groups alone: a
 * global decision needs one step over every group. ZB_EINVAL for a range past the registered
 * groups. Since ZENBIND_0.4. */
zb_status zb_worker_submit_groups(zb_worker_t *worker, const zb_worker_step *step, unsigned first,
                                  unsigned count);

/* What a step found. */
typedef struct zb_worker_result {
    uint64_t nonfinite; /* gradient elements not finite after grad_scale */
    double grad_norm;   /* L2 norm of the scaled gradients over all groups, before clipping (inf or
                           NaN when some are not finite); 0 if not computed */
    int skipped;        /* 1: ZB_STEP_SKIP_NONFINITE found a non-finite gradient; nothing written */
    double seconds;     /* the worker's own time for the step */
} zb_worker_result;

/* Wait up to timeout_ms (>= 0; 0 polls) for the step in flight. ZB_ETIMEDOUT leaves it in flight
 * (wait again); ZB_EDEAD says how the worker died. *out (may be NULL) receives the result of a
 * step that ended; a failed wait leaves it unwritten. */
zb_status zb_worker_wait_result(zb_worker_t *worker, int timeout_ms, zb_worker_result *out);

/* A group's optimizer state between steps, for checkpoints. Not allowed while a step is in flight
 * (ZB_EINVAL); an unknown group is ZB_EINVAL. The moments live only in the worker, on its
 * threads' NUMA nodes. They are read from and written into its memory straight
 * (process_vm_readv(2), process_vm_writev(2)) where the system lets a process reach its child's;
 * where it does not (Yama's ptrace_scope 2 or 3, a seccomp filter) they travel through a temporary
 * shared segment of 8 bytes per parameter, copied by the worker's pinned threads. Every wait is
 * bounded by control_timeout_ms (past it the worker is stopped: ZB_ETIMEDOUT, then ZB_EDEAD). */

/* exp_avg and exp_avg_sq receive numel floats each (NULL: skip that one); *step (may be NULL) the
 * group's step count, the number of steps applied to it (0 for a fresh group): only it asks the
 * worker (a round trip) where the moments are read straight. A call that fails may have written
 * the moments already: their contents are then unspecified. */
zb_status zb_worker_group_get_state(zb_worker_t *worker, unsigned group, float *exp_avg,
                                    float *exp_avg_sq, int64_t *step);
/* The same state without a copy into the caller's memory, for a caller that only reads it or
 * keeps it (a checkpoint): the moments are copied once, into memory of their own handed over as
 * *state. *exp_avg and *exp_avg_sq point at numel floats each in it, 64-byte aligned, writable,
 * valid until zb_worker_state_release(*state), which may come after zb_worker_destroy. The memory
 * is the caller's alone: writes to it stay there (zb_worker_group_set_state gives the worker new
 * state) and a forked child gets a copy-on-write view. 8 bytes per parameter (anonymous memory
 * faulted in by the reading threads; where the moments come through a segment, a private view of
 * it, placed like the worker's memory, zb_worker_attr.mems). All three pointers are required; step
 * may be NULL (no round trip, as for get_state). Added in ABI 2.1 (ZENBIND_2.1). */
typedef struct zb_worker_state zb_worker_state_t;
zb_status zb_worker_group_take_state(zb_worker_t *worker, unsigned group, zb_worker_state_t **state,
                                     float **exp_avg, float **exp_avg_sq, int64_t *step);
/* Unmaps what zb_worker_group_take_state handed out; NULL is a no-op. */
void zb_worker_state_release(zb_worker_state_t *state);
/* Writes them as given (the caller's checkpoint): NULL moments mean zeros; step >= 0 becomes the
 * group's count (the next step with zb_worker_step.step == 0 uses step + 1); negative is
 * ZB_EINVAL. The moments go as zb_worker_group_load_state's do. */
zb_status zb_worker_group_set_state(zb_worker_t *worker, unsigned group, const float *exp_avg,
                                    const float *exp_avg_sq, int64_t step);
/* Elements [offset, offset + numel) of a group, for zb_worker_group_load_state: their moments
 * are read from exp_avg and exp_avg_sq, numel floats each (NULL: zeros). */
typedef struct zb_state_range {
    size_t offset, numel;
    const float *exp_avg, *exp_avg_sq;
} zb_state_range;
/* zb_worker_group_set_state from where a checkpoint holds the moments (a tensor per parameter),
 * with no gathering first: the group's moments become the ranges' values, zeros between and
 * after them (count 0: all zeros), and step its count. The ranges are sorted, disjoint, non-empty
 * and inside the group; any other table is ZB_EINVAL and changes nothing. The moments are written
 * straight into the worker's memory (process_vm_writev(2)) where the system lets a process write
 * into its child's; where it does not (Yama ptrace_scope 2 or 3, a seccomp filter), they travel
 * through a fresh transfer segment, as the state out does. The ranges' memory must be readable:
 * where it is not, the call fails (ZB_EINVAL, the group's moments then unspecified: load again)
 * or crashes as memcpy(3) would. Added in ABI 2.1 (ZENBIND_2.1). */
zb_status zb_worker_group_load_state(zb_worker_t *worker, unsigned group,
                                     const zb_state_range *ranges, size_t count, int64_t step);

/* A range of a group's elements, [offset, offset + numel), that steps differently from the rest:
 * torch counts steps per parameter and leaves a parameter without a gradient alone, where the
 * worker steps and counts whole groups.
 *  - lag >= 1: the range took `lag` fewer steps than the group (a parameter that had no gradient
 *    at some steps). A step numbered S (the group's count + 1 by default) updates it as step
 *    S - lag, so its bias correction is that of its own count; nothing else differs.
 *  - idle 1 (else 0): steps leave the range alone, its weights, moments, copy-out and snapshot
 *    (a parameter without a gradient now); the group's count goes on, so the range falls behind
 *    it. Its lag (>= 0) does not matter while it is idle. A step that reads every gradient first
 *    (ZB_STEP_SKIP_NONFINITE, ZB_STEP_GRAD_NORM, max_grad_norm) counts its gradients in the norm
 *    and the non-finite count, so leave them zero; a plain step counts only what it updates. */
typedef struct zb_step_range {
    uint64_t offset;
    uint64_t numel;
    int64_t lag;
    uint32_t idle;
    uint32_t reserved; /* 0 */
} zb_step_range;

/* Replaces the group's ranges with these `count` (sorted, disjoint, inside the group, numel >= 1,
 * each lagging or idle; else ZB_EINVAL and the old ones stay); count 0 clears them. They hold
 * across steps and set_state until replaced: the caller updates a lag when its range falls
 * further behind, and clears idle when the parameter has gradients again. A step whose number S
 * is not above the lag of a range it updates is ZB_EINVAL, writing nothing. Between steps only.
 * (ZENBIND_2.1) */
zb_status zb_worker_group_set_ranges(zb_worker_t *worker, unsigned group,
                                     const zb_step_range *ranges, size_t count);

/* Memory in bytes. Per buffer kind, what the layout needs (shared buffers are counted once);
 * per process, what /proc/PID/status says now (VmRSS = RssAnon + RssFile + RssShmem; the shared
 * buffers appear in the RssShmem of each process that touched them). */
typedef struct zb_worker_memory {
    size_t numel;           /* parameters in all groups */
    size_t params;          /* fp32 master copies, shared: 4 per parameter */
    size_t grads;           /* the gradient buffers, shared: 1 or 2 x dtype size per parameter */
    size_t copy_out;        /* shared: 0 or 2 per parameter */
    size_t stale;           /* shared: 0 or 4 per parameter */
    size_t moments;         /* exp_avg + exp_avg_sq, private to the worker: 8 per parameter */
    size_t shm_reserved;    /* shared memory reserved (the above, page-rounded, plus control) */
    double bytes_per_param; /* (params + grads + copy_out + stale + moments) / numel */
    size_t worker_rss, worker_rss_anon, worker_rss_shmem;
    size_t trainer_rss, trainer_rss_anon, trainer_rss_shmem;
} zb_worker_memory;

zb_status zb_worker_memory_usage(zb_worker_t *worker, zb_worker_memory *out);

/* The worker's pid. */
zb_status zb_worker_pid(const zb_worker_t *worker, pid_t *pid);
/* The worker's thread count, and thread `index`'s kernel tid and the CPU it pinned itself to (as
 * the thread reported after sched_setaffinity; check with /proc/PID/task/TID/status). */
zb_status zb_worker_threads(const zb_worker_t *worker, unsigned *count);
zb_status zb_worker_thread(const zb_worker_t *worker, unsigned index, pid_t *tid, int *cpu);

#ifdef __cplusplus
}
#endif

#endif /* ZENBIND_WORKER_H */
