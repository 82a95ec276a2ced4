#include "worker_team.hpp"

#include <zbadam/adam.hpp>
#include <zbadam/grad_stats.hpp>
#include <zbadam/team_share.hpp>

#include <zbproto/fd_passing.hpp>
#include <zbproto/futex.hpp>
#include <zbproto/group.hpp>
#include <zbproto/numa.hpp>
#include <zenbind/zenbind.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <omp.h>
#include <poll.h>
#include <sched.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace zb::opt::worker {
namespace {

namespace proto = zb::proto;

// The longest busy wait for a command that the worker accepts, whatever worker_spin_us says: it
// checks that its trainer lives only between spins (libzenbind allows no more either).
constexpr int64_t kMaxSpinNs = 50'000'000;

// Whether the trainer can no longer shrink the memfd `fd` (libzenbind seals each one it sends):
// a page of a mapping cut off by a later ftruncate would kill the worker with SIGBUS.
bool cannot_shrink(int fd) {
    const int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

// One parameter group. Each thread updates its adam_slice of every group, so a thread's share of a
// group's moments is the share it zeroed (first touch) when the group was added: NUMA-local on
// every node of the optimizer's CPUs, whatever groups come before or after. (A thread that falls
// behind has the last chunks of its slice updated by the others: TeamShare.) (One kernel call over
// the concatenation of several groups would move the slice boundaries whenever a group is added.)
struct Group {
    char *base = nullptr;
    size_t size = 0;
    float *moments = nullptr; // exp_avg, then exp_avg_sq at moments + stride
    size_t stride = 0;
    size_t numel = 0;
    AdamHyper hyper;
    AdamTensor tensor;
    const void *grads[2] = {}; // validated once: the step never re-reads offsets from the segment
    GradType grad = GradType::f32;
    CopyType copy = CopyType::none;
    int64_t steps = 0;      // steps applied: the next step with number 0 is steps + 1
    size_t first_block = 0; // its gradient-statistics blocks in Team::blocks
    // Ranges that lag the group's count or are idle (set_ranges), and a step's cut of the group
    // at them: the pieces it updates (none of an idle range), and the hyperparameters of the
    // lagging ones (the group's, with step - lag).
    std::vector<proto::StepRange> ranges;
    std::vector<AdamTensor> pieces;
    std::vector<AdamHyper> lagged;
    // With idle ranges, the pieces are fewer elements than the group: each thread's slice of them
    // (TeamShare::slice_next), the elements of its slice of the group, whose pages it first
    // touched. Empty: the pieces' own adam_slices, which are the group's.
    std::vector<size_t> skipped, bounds;
};

// What the whole team does once the master has taken a command. Commands the master answers on
// its own (errors, empty steps) never wake the team.
enum class Work { answered, step, zero_moments, state_out, state_in, exit };

struct Team {
    Team(proto::Control &control, int socket_fd, int parent_pidfd)
        : ctl(control), sock(socket_fd), parent(parent_pidfd) {}

    proto::Control &ctl;
    int sock;
    int parent;
    int threads = 0;           // the team's, checked at its start (not ctl.nthreads, which the
                               // trainer may rewrite)
    std::vector<Group> groups; // capacity reserved: no reallocation, pointers stay valid
    size_t first = 0, end = 0; // the groups the step in progress covers: [first, end)
    Work work = Work::answered;
    uint32_t seq = 0; // the request being served
    // The request's fields the work uses after the master checked them, read from the control
    // block once: the trainer may write it at any time.
    int64_t step = 0;
    float grad_scale = 1;
    uint32_t flags = 0;
    float max_grad_norm = 0;
    std::atomic<uint64_t> nonfinite{0};
    TeamShare share; // how the team shares out each group's step
    std::chrono::steady_clock::time_point step_start;
    // The step's pre-pass: whether it runs, one result per block of every group (sized at
    // registration), and whether it found the step must be skipped.
    bool stats = false;
    bool skip = false;
    GradStats found;
    std::vector<GradStats> blocks;
    // A state command's group and its mapped transfer segment (null: none was sent), or
    // in_place: set_state's moments already written into the group's memory by the trainer.
    size_t state_group = 0;
    char *transfer = nullptr;
    bool in_place = false;

    void answer(zb_status status, const char *message) {
        ctl.status = status;
        std::snprintf(ctl.message, sizeof ctl.message, "%s", message);
        proto::publish(ctl.done_seq, ctl.trainer_sleeping, seq);
    }
};

GradType grad_type(proto::Dtype grad) {
    return grad == proto::Dtype::bf16  ? GradType::bf16
           : grad == proto::Dtype::f16 ? GradType::f16
                                       : GradType::f32;
}

CopyType copy_type(proto::Dtype copy) {
    return copy == proto::Dtype::bf16  ? CopyType::bf16
           : copy == proto::Dtype::f16 ? CopyType::f16
                                       : CopyType::none;
}

// Master only: receive the groups' memfd and map the group's range of it, reserve its moments. The
// team then zeroes the moments, each thread its own slice, so that first touch places them next to
// their users.
Work add_group(Team &t) {
    uint32_t index = 0;
    const int fd = proto::receive_fd(t.sock, index);
    if (fd < 0) {
        t.answer(ZB_EINTERNAL, "no shared-memory fd arrived with the group");
        return Work::answered;
    }
    struct stat st {};
    const bool known = index < proto::kMaxGroups && index == t.ctl.ngroups &&
                       index == t.groups.size() && fstat(fd, &st) == 0 && st.st_size > 0 &&
                       cannot_shrink(fd);
    const proto::GroupDesc d = known ? t.ctl.groups[index] : proto::GroupDesc{};
    const size_t n = d.numel;
    const char *why = known ? proto::group_fits(d, static_cast<uint64_t>(st.st_size))
                            : "it is not the next group, or its shared memory is empty or not "
                              "sealed against shrinking";
    if (why) {
        close(fd);
        t.answer(ZB_EINTERNAL,
                 ("the group's descriptor does not match its shared memory: " + std::string(why))
                     .c_str());
        return Work::answered;
    }
    void *base = mmap(nullptr, d.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(d.segment_offset));
    const int map_err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        t.answer(ZB_ENOMEM,
                 (std::string("cannot map the group: ") + std::strerror(map_err)).c_str());
        return Work::answered;
    }
    Group g;
    g.base = static_cast<char *>(base);
    g.size = d.segment_size;
    g.numel = n;
    g.stride = proto::page_round(4 * n) / 4;
    void *m =
        mmap(nullptr, 8 * g.stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        munmap(base, d.segment_size);
        t.answer(ZB_ENOMEM, ("cannot allocate " + std::to_string(8 * n) +
                             " bytes of Adam moments: " + std::strerror(errno))
                                .c_str());
        return Work::answered;
    }
    const uint32_t nmems = t.ctl.nmems < proto::kMaxNodes ? t.ctl.nmems : proto::kMaxNodes;
    proto::prefer_nodes(m, 8 * g.stride, t.ctl.mems, nmems);
    g.moments = static_cast<float *>(m);
    t.ctl.moments = reinterpret_cast<uintptr_t>(m);
    g.grad = grad_type(d.grad);
    g.copy = copy_type(d.copy);
    g.first_block = t.blocks.size();
    t.blocks.resize(t.blocks.size() + grad_stats_blocks(n));
    Group &added = t.groups.emplace_back(g);
    AdamTensor &tensor = added.tensor;
    tensor.param = reinterpret_cast<float *>(g.base + d.off_params);
    tensor.exp_avg = g.moments;
    tensor.exp_avg_sq = g.moments + g.stride;
    tensor.copy_out = d.off_copy ? g.base + d.off_copy : nullptr;
    tensor.stale = d.off_stale ? reinterpret_cast<float *>(g.base + d.off_stale) : nullptr;
    tensor.n = n;
    tensor.hyper = &added.hyper;
    added.grads[0] = g.base + d.off_grads[0];
    added.grads[1] = d.off_grads[1] ? g.base + d.off_grads[1] : nullptr;
    return Work::zero_moments;
}

// Master only: the newest group gone, its shared segment and its moments unmapped (the trainer
// undoing a registration that failed on its side). Only the newest: group indices stay dense, and
// the gradient-statistics blocks end where its own began.
Work remove_group(Team &t) {
    if (t.groups.empty() || t.ctl.ngroups != t.groups.size() - 1) {
        t.answer(ZB_EINTERNAL, "only the newest group can be removed");
        return Work::answered;
    }
    const Group &g = t.groups.back();
    munmap(g.base, g.size);
    munmap(g.moments, 8 * g.stride);
    t.blocks.resize(g.first_block);
    t.groups.pop_back();
    t.answer(ZB_OK, "");
    return Work::answered;
}

// Master only: the group cut at its ranges for this step (no cut without any): a lagging range
// stepped with its own step number, an idle one not at all. Returns why the step cannot be
// taken, or "".
std::string cut_at_ranges(Group &g, int threads) {
    g.pieces.clear();
    g.lagged.clear();
    g.skipped.clear();
    g.bounds.clear();
    g.lagged.reserve(g.ranges.size()); // no reallocation: the pieces point into it
    const size_t grad_size = g.grad == GradType::f32 ? 4 : 2;
    const auto piece = [&](size_t from, size_t n, const AdamHyper *hyper) {
        AdamTensor p = g.tensor;
        p.param += from;
        p.exp_avg += from;
        p.exp_avg_sq += from;
        p.grad = static_cast<const char *>(g.tensor.grad) + grad_size * from;
        if (p.copy_out) p.copy_out = static_cast<char *>(p.copy_out) + 2 * from;
        if (p.stale) p.stale += from;
        p.n = n;
        p.hyper = hyper;
        g.pieces.push_back(p);
    };
    size_t at = 0;
    for (const proto::StepRange &r : g.ranges) {
        if (r.offset > at) piece(at, r.offset - at, &g.hyper);
        at = r.offset + r.numel;
        if (r.idle) {
            g.skipped.push_back(r.offset);
            g.skipped.push_back(at);
            continue;
        }
        if (r.lag >= g.hyper.step)
            return "the range at element " + std::to_string(r.offset) + " lags " +
                   std::to_string(r.lag) + " steps behind its group: step number " +
                   std::to_string(g.hyper.step) + " would leave it none";
        AdamHyper &h = g.lagged.emplace_back(g.hyper);
        h.step -= r.lag;
        piece(r.offset, r.numel, &h);
    }
    if (!g.ranges.empty() && at < g.numel) piece(at, g.numel - at, &g.hyper);
    if (!g.skipped.empty() && TeamShare::fits(g.numel, threads)) {
        g.bounds.resize(static_cast<size_t>(threads) + 1);
        TeamShare::slices_skipping(g.numel, threads, g.skipped.data(), g.skipped.size() / 2,
                                   g.bounds.data());
    }
    return "";
}

// Master only: the segment sent with a command about group `index` when `transfer` (the
// command's, read once) says one was, received, checked to be that group's, sealed and `size`
// bytes (`valid`: the command's own fields hold), and mapped into `base` (null when none was
// sent). False once it has answered why not.
bool map_transfer(Team &t, proto::Transfer transfer, uint32_t index, bool valid, uint64_t size,
                  const std::string &what, char *&base) {
    base = nullptr;
    uint32_t tag = 0;
    const bool sent = transfer == proto::Transfer::segment;
    const int fd = sent ? proto::receive_fd(t.sock, tag) : -1;
    if (sent && fd < 0) {
        t.answer(ZB_EINTERNAL, ("no shared-memory fd arrived with the " + what).c_str());
        return false;
    }
    struct stat st {};
    if (!valid || (fd >= 0 && (tag != index || fstat(fd, &st) != 0 ||
                               uint64_t(st.st_size) != size || !cannot_shrink(fd)))) {
        if (fd >= 0) close(fd);
        t.answer(ZB_EINTERNAL, ("the " + what +
                                "'s group, size or segment does not match (or it is not "
                                "sealed against shrinking)")
                                   .c_str());
        return false;
    }
    if (fd < 0) return true;
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int map_err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        t.answer(ZB_ENOMEM, ("cannot map the " + what + ": " + std::strerror(map_err)).c_str());
        return false;
    }
    base = static_cast<char *>(p);
    return true;
}

// Master only: a group's ranges, replaced whole (checked first: a refused table changes
// nothing).
Work set_ranges(Team &t) {
    const uint32_t index = t.ctl.ngroups;
    const int64_t count = t.ctl.step;
    const proto::Transfer transfer = t.ctl.transfer;
    const bool valid = index < t.groups.size() && count >= 0 &&
                       uint64_t(count) <= t.groups[index].numel &&
                       (count > 0) == (transfer == proto::Transfer::segment);
    const uint64_t size = valid ? uint64_t(count) * sizeof(proto::StepRange) : 0;
    char *base = nullptr;
    if (!map_transfer(t, transfer, index, valid, size, "step ranges", base)) return Work::answered;
    std::vector<proto::StepRange> ranges;
    try {
        ranges.resize(static_cast<size_t>(valid ? count : 0));
    } catch (const std::bad_alloc &) {
        if (base) munmap(base, size);
        t.answer(ZB_ENOMEM, "no memory for the step ranges");
        return Work::answered;
    }
    if (base) {
        std::memcpy(ranges.data(), base, size);
        munmap(base, size);
    }
    Group &g = t.groups[index];
    uint64_t end = 0;
    for (const proto::StepRange &r : ranges) {
        if (r.offset < end || r.numel == 0 || r.numel > g.numel || r.offset > g.numel - r.numel ||
            r.lag < 0 || r.idle > 1 || r.reserved != 0 || (r.lag == 0 && !r.idle)) {
            t.answer(ZB_EINVAL, ("step ranges of group " + std::to_string(index) +
                                 ": each non-empty, inside the group, after the one before, "
                                 "and lagging by at least 1 or idle (element " +
                                 std::to_string(r.offset) + ")")
                                    .c_str());
            return Work::answered;
        }
        end = r.offset + r.numel;
    }
    g.ranges = std::move(ranges);
    t.answer(ZB_OK, "");
    return Work::answered;
}

// Master only: copy this step's hyperparameters, step numbers and gradient buffer into the
// tensors, and decide whether the gradients need a pre-pass.
Work prepare_step(Team &t) {
    const proto::Control &ctl = t.ctl;
    if (t.groups.empty()) { // a round trip with nothing to update
        t.ctl.nonfinite = 0;
        t.ctl.step_ns = 0;
        t.ctl.grad_norm = 0;
        t.ctl.skipped = 0;
        t.answer(ZB_OK, "");
        return Work::answered;
    }
    // Each field read once: what is checked is what is used.
    const uint32_t first = ctl.first_group, count = ctl.ngroups, grad_buffer = ctl.grad_buffer;
    t.step = ctl.step;
    t.grad_scale = ctl.grad_scale;
    t.flags = ctl.flags;
    t.max_grad_norm = ctl.max_grad_norm;
    if (t.step < 0) {
        t.answer(ZB_EINVAL, "negative step number");
        return Work::answered;
    }
    if (count == 0 || first > t.groups.size() || count > t.groups.size() - first) {
        t.answer(ZB_EINTERNAL, "the trainer and the worker disagree on the number of groups");
        return Work::answered;
    }
    t.first = first;
    t.end = t.first + count;
    for (size_t i = t.first; i < t.end; ++i) {
        Group &g = t.groups[i];
        const proto::GroupDesc &d = ctl.groups[i];
        g.hyper.lr = d.hyper.lr;
        g.hyper.beta1 = d.hyper.beta1;
        g.hyper.beta2 = d.hyper.beta2;
        g.hyper.eps = d.hyper.eps;
        g.hyper.weight_decay = d.hyper.weight_decay;
        g.hyper.adamw = d.hyper.adamw != 0;
        g.hyper.bias_correction = d.hyper.bias_correction != 0;
        if (t.step == 0 && g.steps == INT64_MAX) {
            t.answer(ZB_EINVAL, ("group " + std::to_string(i) +
                                 "'s step count is INT64_MAX: step 0 would overflow it")
                                    .c_str());
            return Work::answered;
        }
        g.hyper.step = t.step ? t.step : g.steps + 1;
        g.hyper.grad_scale = t.grad_scale;
        g.tensor.grad = g.grads[grad_buffer & 1];
        if (!g.tensor.grad) {
            t.answer(ZB_EINVAL, ("group " + std::to_string(i) + " has no gradient buffer " +
                                 std::to_string(grad_buffer & 1))
                                    .c_str());
            return Work::answered;
        }
        if (const std::string why = cut_at_ranges(g, t.threads); !why.empty()) {
            t.answer(ZB_EINVAL, ("group " + std::to_string(i) + ": " + why).c_str());
            return Work::answered;
        }
    }
    t.nonfinite.store(0, std::memory_order_relaxed);
    t.stats =
        (t.flags & (proto::kStepSkipNonfinite | proto::kStepGradNorm)) != 0 || t.max_grad_norm > 0;
    t.skip = false;
    return Work::step;
}

// Master only: receive and map a state command's transfer segment, if one was sent.
Work take_state(Team &t, Work work) {
    const uint32_t index = t.ctl.ngroups;
    const proto::Transfer transfer = t.ctl.transfer;
    t.step = t.ctl.step; // set_state's count, checked below and set by finish()
    const bool in_place = transfer == proto::Transfer::in_place;
    const bool valid = index < t.groups.size() && (!in_place || work == Work::state_in) &&
                       transfer <= proto::Transfer::in_place;
    const uint64_t size = valid ? proto::transfer_layout(t.groups[index].numel).size : 0;
    char *base = nullptr;
    if (!map_transfer(t, transfer, index, valid, size, "optimizer state", base))
        return Work::answered;
    if (work == Work::state_in && t.step < 0) {
        if (base) munmap(base, size);
        t.answer(ZB_EINVAL, "negative step count");
        return Work::answered;
    }
    t.state_group = index;
    t.transfer = base;
    t.in_place = in_place;
    return work;
}

// Master only: the command's own part, and what the team does next.
Work serve(Team &t, proto::Command command) {
    switch (command) {
    case proto::Command::exit:
        return Work::exit;
    case proto::Command::step:
        return prepare_step(t);
    case proto::Command::add_group:
        return add_group(t);
    case proto::Command::get_state:
        return take_state(t, Work::state_out);
    case proto::Command::set_state:
        return take_state(t, Work::state_in);
    case proto::Command::set_ranges:
        return set_ranges(t);
    case proto::Command::remove_group:
        return remove_group(t);
    case proto::Command::none:
        break;
    }
    t.answer(ZB_EINTERNAL, "unknown command");
    return Work::answered;
}

// serve(), with what a command's bookkeeping could not allocate answered instead of escaping the
// team's parallel region (where it would abort the worker).
Work serve_answering(Team &t, proto::Command command) {
    try {
        return serve(t, command);
    } catch (const std::bad_alloc &) {
        t.answer(ZB_ENOMEM, "the optimizer worker ran out of memory serving the command");
    } catch (const std::exception &e) {
        t.answer(ZB_EINTERNAL, e.what());
    }
    return Work::answered;
}

// Master only: bounded sleeps on req_seq, checking between them that the trainer lives.
proto::Command next_command(Team &t) {
    const uint32_t seen = t.seq;
    const int64_t spin = std::min<int64_t>(int64_t(t.ctl.worker_spin_us) * 1000, kMaxSpinNs);
    uint32_t v = proto::spin_for_change(t.ctl.req_seq, seen, spin);
    while (v == seen) {
        pollfd p{t.parent, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) return proto::Command::exit; // the trainer died
        v = proto::sleep_for_change(t.ctl.req_seq, t.ctl.worker_sleeping, seen, 50'000'000);
    }
    t.seq = v;
    return t.ctl.command;
}

void zero_slice(const Group &g, int thread, int threads) {
    size_t lo, hi;
    adam_slice(g.numel, thread, threads, lo, hi);
    std::memset(g.moments + lo, 0, 4 * (hi - lo));
    std::memset(g.moments + g.stride + lo, 0, 4 * (hi - lo));
}

// This thread's share of a state transfer: the slice it updates, so the moments it writes stay on
// its node.
void copy_state(const Group &g, char *transfer, bool out, int thread, int threads) {
    size_t lo, hi;
    adam_slice(g.numel, thread, threads, lo, hi);
    float *m = g.moments, *v = g.moments + g.stride;
    float *tm = reinterpret_cast<float *>(transfer);
    float *tv = reinterpret_cast<float *>(transfer + proto::transfer_layout(g.numel).exp_avg_sq);
    if (out) {
        std::memcpy(tm + lo, m + lo, 4 * (hi - lo));
        std::memcpy(tv + lo, v + lo, 4 * (hi - lo));
    } else {
        std::memcpy(m + lo, tm + lo, 4 * (hi - lo));
        std::memcpy(v + lo, tv + lo, 4 * (hi - lo));
    }
}

// The step's groups' blocks in Team::blocks: [lo, hi).
void step_blocks(const Team &t, size_t &lo, size_t &hi) {
    const Group &last = t.groups[t.end - 1];
    lo = t.groups[t.first].first_block;
    hi = last.first_block + grad_stats_blocks(last.numel);
}

// This thread's blocks of the step's pre-pass over the gradients of the step's groups.
void grad_stats_in_team(Team &t, int thread, int threads) {
    size_t from_block, to_block, lo, hi;
    step_blocks(t, from_block, to_block);
    grad_stats_share(to_block - from_block, thread, threads, lo, hi);
    lo += from_block;
    hi += from_block;
    const float scale = t.grad_scale;
    for (size_t i = t.first; i < t.end; ++i) {
        const Group &g = t.groups[i];
        const size_t first = g.first_block, end = first + grad_stats_blocks(g.numel);
        for (size_t b = lo > first ? lo : first; b < hi && b < end; ++b) {
            const size_t from = (b - first) * kGradStatsBlock;
            const size_t to = from + kGradStatsBlock < g.numel ? from + kGradStatsBlock : g.numel;
            t.blocks[b] = grad_block_stats(g.tensor.grad, g.grad, from, to, scale);
        }
    }
}

// Master only, after the pre-pass: skip the step, or fold the clip coefficient into the scale
// the update pass multiplies by.
void decide_step(Team &t) {
    size_t lo, hi;
    step_blocks(t, lo, hi);
    t.found = grad_stats_sum(t.blocks.data() + lo, hi - lo);
    t.skip = (t.flags & proto::kStepSkipNonfinite) && t.found.nonfinite > 0;
    if (t.skip || !(t.max_grad_norm > 0)) return;
    const float coefficient = clip_coefficient(t.max_grad_norm, t.found.sum_squares);
    for (size_t i = t.first; i < t.end; ++i) {
        Group &g = t.groups[i];
        g.hyper.grad_scale = t.grad_scale * coefficient;
        for (AdamHyper &h : g.lagged)
            h.grad_scale = g.hyper.grad_scale;
    }
}

// Master only, once the team is done: record what the work changed and answer.
void finish(Team &t, Work work) {
    proto::Control &ctl = t.ctl;
    if (work == Work::step) {
        ctl.nonfinite = t.stats ? t.found.nonfinite : t.nonfinite.load(std::memory_order_relaxed);
        ctl.grad_norm = t.stats ? std::sqrt(t.found.sum_squares) : 0.0;
        ctl.skipped = t.skip ? 1 : 0;
        if (!t.skip)
            for (size_t i = t.first; i < t.end; ++i)
                t.groups[i].steps = t.groups[i].hyper.step;
        ctl.step_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - t.step_start)
                                                .count());
    } else if (work == Work::state_out || work == Work::state_in) {
        Group &g = t.groups[t.state_group];
        if (work == Work::state_out)
            ctl.state_step = g.steps;
        else
            g.steps = t.step;
        if (t.transfer) munmap(t.transfer, proto::transfer_layout(g.numel).size);
        t.transfer = nullptr;
        t.in_place = false;
    }
    t.answer(ZB_OK, "");
}

void publish_ready(proto::Control &ctl, proto::Ready ready) {
    proto::publish(ctl.ready, ctl.trainer_sleeping, static_cast<uint32_t>(ready));
}

// Master only, once the team is up: why it cannot serve, or "" if it can.
std::string team_problem(int threads, int pin_failures) {
    char why[proto::kMessageSize];
    if (omp_get_num_threads() != threads)
        std::snprintf(why, sizeof why,
                      "OpenMP gave the worker %d of the %d threads asked for (a thread limit in "
                      "its environment?)",
                      omp_get_num_threads(), threads);
    else if (pin_failures)
        std::snprintf(why, sizeof why,
                      "%d of %d threads could not pin themselves to their CPU (outside this "
                      "process's cgroup or affinity?)",
                      pin_failures, threads);
    else
        why[0] = '\0';
    return why;
}

} // namespace

proto::Exit run_team(proto::Control &ctl, int socket_fd, int parent_pidfd) {
    Team t(ctl, socket_fd, parent_pidfd);
    t.groups.reserve(proto::kMaxGroups);
    const uint32_t nthreads = ctl.nthreads; // read once: the trainer may rewrite it
    const int threads = static_cast<int>(nthreads);
    t.threads = threads;
    if (threads < 1 || nthreads > proto::kMaxThreads) {
        ctl.status = ZB_EINVAL;
        std::snprintf(ctl.message, sizeof ctl.message, "bad thread count %u", nthreads);
        publish_ready(ctl, proto::Ready::failed);
        return proto::Exit::failure;
    }
    std::atomic<int> pin_failures{0};
    bool team_failed = false; // written by the master before the team's first barrier
    omp_set_dynamic(0);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num();
        const int cpu = ctl.cpus[me];
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        const bool pinned =
            cpu >= 0 && cpu < CPU_SETSIZE && sched_setaffinity(0, sizeof set, &set) == 0;
        ctl.tids[me] = static_cast<int32_t>(gettid());
        ctl.thread_cpus[me] = pinned ? cpu : -1;
        if (!pinned) pin_failures.fetch_add(1);
#pragma omp barrier
#pragma omp masked
        {
            const std::string problem = team_problem(threads, pin_failures.load());
            if (problem.empty()) {
                publish_ready(ctl, proto::Ready::ready);
            } else {
                ctl.status = ZB_EINVAL;
                std::snprintf(ctl.message, sizeof ctl.message, "%s", problem.c_str());
                t.work = Work::exit;
                team_failed = true;
                publish_ready(ctl, proto::Ready::failed);
            }
        }
        for (;;) {
#pragma omp masked
            {
                while (t.work != Work::exit) {
                    const proto::Command command = next_command(t);
                    t.step_start = std::chrono::steady_clock::now();
                    t.work = serve_answering(t, command);
                    if (t.work != Work::answered) break;
                }
            }
#pragma omp barrier
            // Read between the two barriers: the primary thread writes t.work only outside them.
            const Work work = t.work;
            if (work == Work::exit) break;
            switch (work) {
            case Work::step: {
                if (t.stats) {
                    grad_stats_in_team(t, me, threads);
#pragma omp barrier
#pragma omp masked
                    decide_step(t);
#pragma omp barrier
                }
                if (t.skip) break;
                uint64_t bad = 0;
                for (size_t i = t.first; i < t.end; ++i) {
                    const Group &g = t.groups[i];
                    const bool cut = !g.ranges.empty();
                    if (cut && g.pieces.empty()) continue; // every element idle (all threads)
                    t.share.slice_next(me, g.bounds.empty() ? nullptr : g.bounds.data());
                    bad += adam_step_in_team(AdamBatch{g.grad, g.copy,
                                                       cut ? g.pieces.data() : &g.tensor,
                                                       cut ? g.pieces.size() : 1},
                                             t.share);
                }
                t.nonfinite.fetch_add(bad, std::memory_order_relaxed);
                break;
            }
            case Work::zero_moments:
                zero_slice(t.groups.back(), me, threads);
                break;
            case Work::state_out:
            case Work::state_in: {
                const Group &g = t.groups[t.state_group];
                if (t.transfer)
                    copy_state(g, t.transfer, work == Work::state_out, me, threads);
                else if (work == Work::state_in && !t.in_place)
                    zero_slice(g, me, threads);
                break;
            }
            case Work::answered:
            case Work::exit:
                break;
            }
#pragma omp barrier
#pragma omp masked
            finish(t, work);
        }
    }
    return team_failed ? proto::Exit::failure : proto::Exit::ok;
}

} // namespace zb::opt::worker
