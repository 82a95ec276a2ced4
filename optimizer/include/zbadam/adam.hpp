// The fused multi-tensor Adam/AdamW step: the interface between the kernels (adam_*.cpp) and their
// users (the worker, zenflow-bench, zenbind tune, tests). One call updates every tensor of a list
// in one pass per element, splitting the concatenated elements across threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zb::opt {

enum class GradType : uint8_t { f32, bf16, f16 };
enum class CopyType : uint8_t { none, bf16, f16 };
// The kernels: the portable scalar one (the reference), and per architecture its vector paths:
// AVX2 and AVX-512 on x86-64, NEON (every ARMv8 CPU) and SVE (any vector length) on aarch64. A
// build has the scalar kernel and its own architecture's; isa_supported() tells which run here.
enum class Isa : uint8_t { scalar, avx2, avx512, neon, sve };
// How the vector paths write the streams they only write (copy-out, stale): `automatic` streams
// them past the caches (non-temporal stores) when a step's bytes exceed the last-level cache, so
// the read of each line before its overwrite is saved; below that, plain stores leave the results
// in the cache for whoever reads them next.
enum class Stores : uint8_t { automatic, cached, streaming };

// torch.optim.Adam/AdamW semantics; eps is added after bias correction. The defaults are
// torch.optim.AdamW's, and zb_adam_hyper_init() gives these very values.
struct AdamHyper {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 1e-2f;
    bool adamw = true; // decoupled weight decay (AdamW) or L2 added to the gradient (Adam)
    bool bias_correction = true;
    int64_t step = 1;        // 1-based step number, for bias correction
    float grad_scale = 1.0f; // multiplies every gradient (unscaling and clipping in the same pass)
};

// One tensor. grad points to elements of the batch's GradType; copy_out (may be null) to elements
// of its CopyType; stale (may be null) receives the updated fp32 params (ZenFlow's snapshot).
struct AdamTensor {
    float *param = nullptr;
    const void *grad = nullptr;
    float *exp_avg = nullptr;
    float *exp_avg_sq = nullptr;
    void *copy_out = nullptr;
    float *stale = nullptr;
    size_t n = 0;
    const AdamHyper *hyper = nullptr; // per-tensor (per parameter group) hyperparameters
};

struct AdamBatch {
    GradType grad = GradType::f32;
    CopyType copy = CopyType::none;
    const AdamTensor *tensors = nullptr;
    size_t count = 0;
};

// Runs the step with `threads` OpenMP threads (0: the current OpenMP default) in one parallel
// region, on the best ISA of this CPU unless force_isa() was called. Returns how many gradient
// elements were not finite after scaling (they are still applied, as torch does).
uint64_t adam_step(const AdamBatch &batch, int threads);

// Same, from inside an existing OpenMP parallel region: every thread of the team calls it with the
// same batch and the same TeamShare (team_share.hpp), updates the chunks of its own slice, then
// helps the others with theirs (the worker keeps one pinned team alive across steps). Returns
// this thread's count of non-finite gradients.
class TeamShare;
uint64_t adam_step_in_team(const AdamBatch &batch, TeamShare &share);

// The elements [lo, hi) of the concatenation of a batch's tensors that `thread` of `threads`
// owns: it updates them unless it falls behind the others. Boundaries are multiples of 16
// elements, so neighbouring threads do not share the cache lines of aligned buffers; callers that
// first-touch memory use it to place pages.
void adam_slice(size_t total, int thread, int threads, size_t &lo, size_t &hi);

Isa best_isa();              // the kernel adam_step uses unless told otherwise
bool isa_supported(Isa isa); // built for this architecture, and this CPU and its OS can run it
Isa active_isa();            // what adam_step uses now
// Tests and benchmarks: makes adam_step use `isa`. Refuses (false, nothing changed) an ISA this
// build or CPU lacks, so a caller cannot believe it ran a kernel it did not.
[[nodiscard]] bool force_isa(Isa isa);
const char *isa_name(Isa isa);

void force_stores(Stores s);                 // tests and benchmarks; automatic by default
Stores stores_for(size_t bytes);             // cached or streaming, for a step of `bytes`
Stores batch_stores(const AdamBatch &batch); // how adam_step writes the batch's copy-out, stale
size_t last_level_cache();                   // bytes, from sysfs (32 MiB when it cannot tell)
const char *stores_name(Stores s);

// Where the vector paths prefetch the lines of the streams they read, a fixed distance ahead
// (adam_kernels.hpp): into L1, into L2, or not at all (the hardware prefetchers alone). It changes
// only when lines arrive, never a result. Which is faster depends on the machine (the same Zen 4
// guest model has measured either way), so by default (automatic) it is chosen at run time: the
// process's large calls (64 chunks or more, 16 or more per thread) of each kind (elements,
// streams, tensors) run in pairs, one without and one with prefetching into L2, each timed on the
// team's first thread, until kCalibrationPairs pairs (two calls of a kind in a row) are timed; the
// process then keeps L2 where the median of the pairs' ratios is below 0.97, else none (and none
// after 8 times as many calls without them). Calls that are not timed run without. force_prefetch()
// fixes a mode (tests, benchmarks), automatic returns to the run-time choice.
enum class Prefetch : uint8_t { off, l1, l2, automatic };
void force_prefetch(Prefetch p);
Prefetch requested_prefetch();         // what force_prefetch() set: automatic by default
Prefetch active_prefetch();            // what a small call uses now: off, l1 or l2
Prefetch chosen_prefetch();            // the run-time choice, off or l2; automatic until it is made
const char *prefetch_name(Prefetch p); // off, l1, l2, auto
inline constexpr int kCalibrationPairs = 5;

} // namespace zb::opt
