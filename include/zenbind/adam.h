/* adam.h: the Adam/AdamW step of libzenbind in the caller's own process.
 *
 * The kernel the zenflow-optimizer worker runs, for an optimizer that steps in the training
 * process itself (srun --zenflow-bind=mode=offload, FSDP2's CPUOffloadPolicy, a C++ trainer): one
 * fused pass over every tensor, AVX-512 or AVX2 on x86-64, SVE or NEON on aarch64, as the CPU
 * allows, the same bits on every path, architecture and thread count (but for the sign of a NaN
 * an operation makes: negative on x86-64, positive on Arm), the same arithmetic and results as a
 * worker step. See libzenbind(3), section IN-PROCESS ADAM.
 *
 * Conventions are those of <zenbind/zenbind.h>: a zb_status with a message in zb_last_error();
 * nothing is written when the arguments are refused.
 */
#ifndef ZENBIND_ADAM_H
#define ZENBIND_ADAM_H

#include <zenbind/worker.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor: numel elements of each stream, updated in place. */
typedef struct zb_adam_tensor {
    float *param;               /* fp32 (master) parameters */
    const void *grad;           /* gradients, of zb_adam_args.grad's type */
    float *exp_avg;             /* first moment, fp32 */
    float *exp_avg_sq;          /* second moment, fp32 */
    void *copy_out;             /* zb_adam_args.copy_out's type, or NULL when that is NONE */
    size_t numel;               /* 0 is allowed (nothing to do) */
    const zb_adam_hyper *hyper; /* this tensor's hyperparameters; NULL: zb_adam_args.hyper */
    int64_t step;               /* this tensor's step number (torch counts per parameter); 0:
                                   zb_adam_args.step */
} zb_adam_tensor;

/* zb_adam_args.threads: every thread of the calling OpenMP team calls zb_adam_step with the same
 * arguments, and together they update the tensors (a team the caller keeps alive across steps). */
#define ZB_ADAM_TEAM (-1)

/* The most threads zb_adam_args.threads may ask for (OpenMP would try to make any number). */
#define ZB_ADAM_MAX_THREADS 1024

/* A step's arguments. Fill it with zb_adam_args_init(), which sets size; fields a later release
 * adds go at the end, and a caller built against this header keeps working. */
typedef struct zb_adam_args {
    size_t size;         /* sizeof(zb_adam_args) as the caller was compiled: zb_adam_args_init() */
    zb_dtype grad;       /* FP32, BF16 or FP16 */
    zb_dtype copy_out;   /* NONE, BF16 or FP16: the updated parameters, converted */
    zb_adam_hyper hyper; /* for tensors whose hyper is NULL */
    int64_t step;     /* >= 1: the step number, for bias correction (tensors may have their own) */
    float grad_scale; /* multiplies every gradient (e.g. 1/loss_scale) */
    unsigned flags;   /* ZB_STEP_SKIP_NONFINITE, ZB_STEP_GRAD_NORM (worker.h) */
    float max_grad_norm; /* > 0: clip by the global norm, as zb_worker_step; 0: no clipping */
    int threads; /* 1..ZB_ADAM_MAX_THREADS: that many OpenMP threads; 0: OpenMP's default; or
                    ZB_ADAM_TEAM */
} zb_adam_args;

/* Defaults: grad FP32, copy_out NONE, hyper from zb_adam_hyper_init(), step 1, grad_scale 1,
 * flags 0, max_grad_norm 0, threads 0; `size` to `size`. */
void zb_adam_args_init_size(zb_adam_args *args, size_t size);
static inline void zb_adam_args_init(zb_adam_args *args) {
    zb_adam_args_init_size(args, sizeof *args);
}

/* One Adam/AdamW step over count tensors, as a zb_worker_step with the same arguments does. With
 * ZB_STEP_SKIP_NONFINITE and a non-finite scaled gradient anywhere, nothing is written and
 * result->skipped is 1. result (may be NULL) receives what the step found; its seconds, the time
 * the call took. ZB_EINVAL for a bad argument (a NULL stream of a non-empty tensor, an unknown
 * dtype or flag, a step < 1, a hyperparameter out of range, a size smaller than this release's
 * first zb_adam_args), before anything is written. */
zb_status zb_adam_step(const zb_adam_tensor *tensors, size_t count, const zb_adam_args *args,
                       zb_worker_result *result);

/* What zb_adam_grad_stats found. */
typedef struct zb_grad_stats {
    double sum_squares; /* of every grad * grad_scale, each product rounded to fp32 first */
    uint64_t nonfinite; /* elements whose grad * grad_scale is not finite */
} zb_grad_stats;

/* The pre-pass alone of a step with ZB_STEP_SKIP_NONFINITE or ZB_STEP_GRAD_NORM over the same
 * tensors and arguments: the same sum and count, to the bit, for any thread count. It reads the
 * gradients (grad and numel of each tensor; the other streams may be NULL) and writes only *out;
 * of args it takes grad, grad_scale and threads. For a caller whose gradients are split across
 * processes (FSDP2's shards): each adds its sums to the others', decides, and steps with the
 * decision (grad_scale times the clip coefficient, or no step). ZB_EINVAL as zb_adam_step for
 * those fields, a NULL grad of a non-empty tensor, or a NULL out. (ZENBIND_2.1) */
zb_status zb_adam_grad_stats(const zb_adam_tensor *tensors, size_t count, const zb_adam_args *args,
                             zb_grad_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* ZENBIND_ADAM_H */
