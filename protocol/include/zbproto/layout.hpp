// The shared-memory layout between libzenbind (the trainer side) and zenflow-optimizer (the
// worker). Both sides link this module; the header's magic, version and sizes let each side refuse
// a peer built from another version instead of corrupting memory. Any change to a struct below
// must bump kVersion.
//
// Two memfds: the control segment (Header then Control) created at spawn, and the groups' memfd,
// which grows by one page-aligned range per parameter group (params, grads[2], copy-out, stale;
// offsets in its GroupDesc, the range at GroupDesc::segment_offset), handed to the worker over a
// socket (SCM_RIGHTS) with each group it registers. One memfd for every group: a trainer with
// thousands of groups holds two fds, not thousands.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zb::proto {

inline constexpr uint64_t kMagic = 0x314d5357464e455aULL; // "ZENFWSM1" little-endian
inline constexpr uint32_t kVersion = 8;
inline constexpr uint32_t kMaxGroups = 4096;
inline constexpr uint32_t kMaxThreads = 1024;
inline constexpr uint32_t kMaxNodes = 64;
inline constexpr uint32_t kMessageSize = 512;

// The worker's exit codes. The trainer tells a layout refusal from any other death by the code.
enum class Exit : int {
    ok = 0,
    failure = 1, // could not start its team (the reason is in the control block)
    usage = 2,   // started by hand with arguments
    version = 78 // refused the control block's header (and said why on stderr); EX_CONFIG
};

// Control::ready, written by the worker once, when its team is pinned or could not be.
enum class Ready : uint32_t { starting = 0, ready = 1, failed = 2 };

// Worker protocol over the inherited fds: the control memfd is fd 3, the socket fd 4.
inline constexpr int kControlFd = 3;
inline constexpr int kSocketFd = 4;

enum class Command : uint32_t {
    none = 0,
    step = 1,
    add_group = 2,
    exit = 3,
    get_state = 4,   // a group's moments out through a transfer segment, and its step count
    set_state = 5,   // and in
    set_ranges = 6,  // a group's StepRanges (Control::step of them) through a transfer segment
    remove_group = 7 // the newest group (Control::ngroups), its memory unmapped
};

// Control::transfer: how a state command's moments travel. set_state with none zeroes them;
// get_state with none returns the step count alone. in_place (set_state): the trainer has written
// them straight into the worker's memory (process_vm_writev, at Control::moments of add_group), so
// the worker only takes the step count.
enum class Transfer : uint32_t { none = 0, segment = 1, in_place = 2 };

// A range of a group that steps differently (zb_step_range): `lag` steps behind the group's
// count, so a step numbered S updates it as step S - lag (bias correction is all the number
// changes), or idle: left alone by steps. A group's ranges are sorted, disjoint and inside it,
// each with lag > 0 or idle; they hold until replaced.
struct StepRange {
    uint64_t offset, numel;
    int64_t lag;
    uint32_t idle, reserved;
};

// Control::flags of a step; the same bits as ZB_STEP_* of <zenbind/worker.h>.
inline constexpr uint32_t kStepSkipNonfinite = 0x1;
inline constexpr uint32_t kStepGradNorm = 0x2;
enum class Dtype : uint32_t { none = 0, f32 = 1, bf16 = 2, f16 = 3 };

inline constexpr size_t dtype_size(Dtype d) {
    return d == Dtype::f32 ? 4 : (d == Dtype::none ? 0 : 2);
}

inline constexpr size_t kPage = 4096;
inline constexpr size_t page_round(size_t n) {
    return (n + kPage - 1) / kPage * kPage;
}

// Fixed first fields: magic and version stay at offsets 0 and 8 in every future version, so any
// worker can tell a mismatch. worker_version is written by the worker with its own kVersion.
struct Header {
    uint64_t magic;
    uint32_t version;
    uint32_t worker_version;
    uint32_t header_size;
    uint32_t control_size;
    uint32_t group_desc_size;
    uint32_t max_groups;
    uint32_t max_threads;
    uint32_t pad;
    uint64_t segment_size;
};

struct Hyper {
    float lr, beta1, beta2, eps, weight_decay;
    uint32_t adamw, bias_correction, pad;
};

struct GroupDesc {
    uint64_t numel;
    uint64_t segment_offset; // where the group's range begins in the groups' memfd (page-aligned)
    uint64_t segment_size;   // the range's bytes; the off_* below are inside it
    uint64_t off_params, off_grads[2], off_copy, off_stale; // off_* 0 when absent (params is 0;
                                                            // grads[0] always there)
    Dtype grad, copy;
    uint32_t stale, pad;
    Hyper hyper;
};

// Hot words each on their own cache line: the trainer writes the request side, the worker the
// response side, so a spinning peer does not steal the line the other is writing.
struct alignas(64) Control {
    // Written by the trainer before spawn.
    int32_t trainer_pid;
    uint32_t nthreads;
    uint32_t nmems;
    uint32_t worker_spin_us;
    int32_t cpus[kMaxThreads]; // thread i pins itself to cpus[i]
    int32_t mems[kMaxNodes];

    // Written by the worker once its team is pinned: a Ready.
    alignas(64) uint32_t ready;
    int32_t tids[kMaxThreads];
    int32_t thread_cpus[kMaxThreads];

    // Request: fields first, then req_seq is published (release).
    alignas(64) uint32_t req_seq;
    uint32_t worker_sleeping; // the worker sleeps on req_seq: wake it
    Command command;
    uint32_t ngroups; // groups the step covers / index of the group being added, read or written
    uint32_t first_group; // a step covers groups first_group .. first_group + ngroups - 1
    int64_t step; // a step's number (0: each group's count + 1) / the step count set_state sets /
                  // set_ranges: how many StepRange ranges
    float grad_scale;
    uint32_t grad_buffer;
    uint32_t flags; // kStep* of a step
    float max_grad_norm;
    Transfer transfer; // get_state/set_state: how the moments travel

    // Response: result and message, then done_seq = req_seq (release).
    alignas(64) uint32_t done_seq;
    uint32_t trainer_sleeping;
    int32_t status;   // a zb_status
    uint32_t skipped; // the step found a non-finite gradient under kStepSkipNonfinite
    uint64_t nonfinite;
    uint64_t step_ns;   // the worker's own time for the step: request taken to answer
    double grad_norm;   // of the scaled gradients, when the step computed it; else 0
    int64_t state_step; // get_state: the group's step count
    uint64_t moments;   // add_group: where the group's moments are in the worker (exp_avg, then
                        // exp_avg_sq page_round(4 * numel) bytes on), for
                        // Transfer::in_place
    char message[kMessageSize];

    alignas(64) GroupDesc groups[kMaxGroups];
};

inline constexpr size_t kControlSegment = (sizeof(Header) + 63) / 64 * 64 + sizeof(Control);

inline Control *control_of(void *base) {
    return reinterpret_cast<Control *>(static_cast<char *>(base) + (sizeof(Header) + 63) / 64 * 64);
}

inline std::atomic_ref<uint32_t> atomic(uint32_t &word) {
    return std::atomic_ref<uint32_t>(word);
}

} // namespace zb::proto
