// A group's optimizer state in and out of the worker, between steps: the moments read from and
// written into the worker's own memory where the system allows it, else through a transfer
// segment.
#include "error.hpp"
#include "omp_team.hpp"
#include "remote_memory.hpp"
#include "worker_handle.hpp"

#include <zbproto/fd_passing.hpp>
#include <zbproto/group.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <sys/mman.h>
#include <utility>
#include <vector>

namespace {

using zb::fail;
using zb::worker_client::send_segment;
using zb::worker_client::state_handle;
namespace proto = zb::proto;

// A large copy between the caller's memory and a fresh transfer segment (the state of a group,
// whose pages on one side or the other are faulted in by this copy): on copy_threads, in 2 MiB
// chunks.
void parallel_copy(void *to, const void *from, size_t bytes) {
    constexpr size_t kChunk = size_t(2) << 20;
    const size_t chunks = (bytes + kChunk - 1) / kChunk;
    const int threads = zb::team_threads(static_cast<int>(zb::remote::copy_threads(bytes)));
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t c = 0; c < chunks; ++c) {
        const size_t at = c * kChunk, size = std::min(kChunk, bytes - at);
        std::memcpy(static_cast<char *>(to) + at, static_cast<const char *>(from) + at, size);
    }
}

// Asks the worker for a group's state: its moments into `seg` (null: the step count alone).
void state_out(zb_worker &w, unsigned group, const zb::shm::Segment *seg) {
    if (seg) send_segment(w, seg->fd(), group, "optimizer state's shared memory");
    w.ctl->command = proto::Command::get_state;
    w.ctl->ngroups = group;
    w.ctl->transfer = seg ? proto::Transfer::segment : proto::Transfer::none;
    w.run_state_command("return the optimizer state of group " + std::to_string(group));
}

// The ranges of a load, checked: sorted, disjoint, inside the group's n elements, none empty.
void check_ranges(const zb_state_range *ranges, size_t count, size_t n, const char *fn) {
    if (count && !ranges) fail(ZB_EINVAL, std::string(fn) + ": ranges is NULL");
    size_t end = 0;
    for (size_t i = 0; i < count; ++i) {
        const zb_state_range &r = ranges[i];
        if (r.numel == 0 || r.offset < end || r.numel > n || r.offset > n - r.numel)
            fail(ZB_EINVAL, std::string(fn) + ": range " + std::to_string(i) + " (elements " +
                                std::to_string(r.offset) + " + " + std::to_string(r.numel) +
                                ") is empty, overlaps the one before or ends past the group's " +
                                std::to_string(n));
        end = r.offset + r.numel;
    }
}

// One moment of the group (`base`: where the worker keeps it) as pieces: each range's values,
// zeros around them.
void moment_pieces(std::vector<zb::remote::Piece> &out, uint64_t base, size_t n,
                   const zb_state_range *ranges, size_t count, bool second) {
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
        const zb_state_range &r = ranges[i];
        if (r.offset > at) out.push_back({base + 4 * at, nullptr, 4 * (r.offset - at)});
        // Only read from: process_vm_writev's local iovecs are not const.
        const float *from = second ? r.exp_avg_sq : r.exp_avg;
        out.push_back({base + 4 * r.offset, const_cast<float *>(from), 4 * r.numel});
        at = r.offset + r.numel;
    }
    if (at < n) out.push_back({base + 4 * at, nullptr, 4 * (n - at)});
}

// Where a group's exp_avg and exp_avg_sq are in the worker (the layout of worker_team.cpp's
// add_group: exp_avg_sq a page-rounded moment after exp_avg).
struct MomentsAt {
    uint64_t exp_avg, exp_avg_sq;
};
MomentsAt moments_at(const zb_worker &w, unsigned group) {
    const uint64_t m = w.moments[group];
    return {m, m + proto::page_round(4 * w.descs[group].numel)};
}

// A read or write of the worker's memory (zb::remote); a worker that died during it is ZB_EDEAD
// saying how it died, as anywhere else.
template <class Transfer> bool reaching(zb_worker &w, Transfer &&transfer) {
    try {
        return transfer();
    } catch (const zb::Error &e) {
        if (e.status() == ZB_EDEAD) w.check_gone();
        throw;
    }
}

// The ranges written into the worker's copy of the moments; false if the system refuses.
bool load_in_place(zb_worker &w, unsigned group, size_t n, const zb_state_range *ranges,
                   size_t count) {
    const MomentsAt at = moments_at(w, group);
    std::vector<zb::remote::Piece> pieces;
    moment_pieces(pieces, at.exp_avg, n, ranges, count, false);
    moment_pieces(pieces, at.exp_avg_sq, n, ranges, count, true);
    return reaching(w, [&] { return zb::remote::write(w.pid, pieces); });
}

// The group's moments read straight from the worker into exp_avg and exp_avg_sq (numel floats
// each; null: not read); false if the system refuses.
bool read_moments(zb_worker &w, unsigned group, float *exp_avg, float *exp_avg_sq) {
    const size_t n = w.descs[group].numel;
    const MomentsAt at = moments_at(w, group);
    std::vector<zb::remote::Piece> pieces;
    if (exp_avg) pieces.push_back({at.exp_avg, exp_avg, 4 * n});
    if (exp_avg_sq) pieces.push_back({at.exp_avg_sq, exp_avg_sq, 4 * n});
    return reaching(w, [&] { return zb::remote::read(w.pid, pieces); });
}

// Anonymous memory of the caller's, unmapped unless released.
struct Anonymous {
    void *base = nullptr;
    size_t size = 0;
    explicit Anonymous(size_t bytes) : size(bytes) {
        base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            base = nullptr;
            fail(ZB_ENOMEM,
                 "cannot map " + std::to_string(size) +
                     " bytes of memory for the optimizer state: " + std::strerror(errno));
        }
    }
    ~Anonymous() {
        if (base) munmap(base, size);
    }
    Anonymous(const Anonymous &) = delete;
    Anonymous &operator=(const Anonymous &) = delete;
    void *release() { return std::exchange(base, nullptr); }
};

// A private view of the state through a transfer segment the worker writes, for a system that
// refuses read_moments: its writes and a fork's stay out of the segment; reading maps the pages
// the worker wrote. The segment's fd and shared mapping go with `seg`; the view alone keeps the
// memory.
void *take_through_segment(zb_worker &w, unsigned group, size_t size) {
    zb::shm::Segment seg("zenflow optimizer state", size, w.mems);
    state_out(w, group, &seg);
    void *view = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, seg.fd(), 0);
    if (view == MAP_FAILED) zb::fail_errno("zb_worker_group_take_state: mmap of the state");
    return view;
}

// The ranges in a fresh transfer segment (zeros elsewhere), for a system that refuses the above.
zb::shm::Segment load_segment(const zb_worker &w, size_t n, const zb_state_range *ranges,
                              size_t count) {
    const proto::TransferLayout t = proto::transfer_layout(n);
    zb::shm::Segment seg("zenflow optimizer state", t.size, w.mems);
    char *base = static_cast<char *>(seg.base());
    for (size_t i = 0; i < count; ++i) {
        const zb_state_range &r = ranges[i];
        if (r.exp_avg) parallel_copy(base + 4 * r.offset, r.exp_avg, 4 * r.numel);
        if (r.exp_avg_sq)
            parallel_copy(base + t.exp_avg_sq + 4 * r.offset, r.exp_avg_sq, 4 * r.numel);
    }
    return seg;
}

void load_state(zb_worker_t *worker, unsigned group, const zb_state_range *ranges, size_t count,
                int64_t step, const char *fn) {
    zb_worker &w = state_handle(worker, group, fn);
    if (step < 0) fail(ZB_EINVAL, std::string(fn) + ": step must be >= 0");
    const size_t n = w.descs[group].numel;
    check_ranges(ranges, count, n, fn);
    // No range: the worker zeroes the moments itself.
    proto::Transfer how = proto::Transfer::none;
    std::optional<zb::shm::Segment> seg;
    if (count && load_in_place(w, group, n, ranges, count)) {
        how = proto::Transfer::in_place;
    } else if (count) {
        seg.emplace(load_segment(w, n, ranges, count));
        send_segment(w, seg->fd(), group, "optimizer state's shared memory");
        how = proto::Transfer::segment;
    }
    w.ctl->command = proto::Command::set_state;
    w.ctl->ngroups = group;
    w.ctl->step = step;
    w.ctl->transfer = how;
    w.run_state_command("set the optimizer state of group " + std::to_string(group));
}

} // namespace

// What zb_worker_group_take_state hands out: memory the moments were read into, or a private view
// of the transfer segment the worker wrote them into.
struct zb_worker_state {
    void *base;
    size_t size;
};

extern "C" {

zb_status zb_worker_group_get_state(zb_worker_t *worker, unsigned group, float *exp_avg,
                                    float *exp_avg_sq, int64_t *step) {
    return zb::guard([&] {
        zb_worker &w = state_handle(worker, group, "zb_worker_group_get_state");
        const size_t n = w.descs[group].numel;
        const proto::TransferLayout t = proto::transfer_layout(n);
        std::optional<zb::shm::Segment> seg;
        if ((exp_avg || exp_avg_sq) && !read_moments(w, group, exp_avg, exp_avg_sq))
            seg.emplace("zenflow optimizer state", t.size, w.mems);
        if (step || seg) state_out(w, group, seg ? &*seg : nullptr); // the count; moments if seg
        if (seg) {
            const char *base = static_cast<const char *>(seg->base());
            if (exp_avg) parallel_copy(exp_avg, base, 4 * n);
            if (exp_avg_sq) parallel_copy(exp_avg_sq, base + t.exp_avg_sq, 4 * n);
        }
        if (step) *step = w.ctl->state_step;
    });
}

zb_status zb_worker_group_take_state(zb_worker_t *worker, unsigned group, zb_worker_state_t **state,
                                     float **exp_avg, float **exp_avg_sq, int64_t *step) {
    return zb::guard([&] {
        zb_worker &w = state_handle(worker, group, "zb_worker_group_take_state");
        if (!state || !exp_avg || !exp_avg_sq)
            fail(ZB_EINVAL, "zb_worker_group_take_state: state, exp_avg or exp_avg_sq is NULL");
        const proto::TransferLayout t = proto::transfer_layout(w.descs[group].numel);
        // Memory of the caller's own, which the moments are read into; its pages are faulted in
        // by the reading threads.
        zb::shm::check_memory_cgroup("memory", "zenflow optimizer state", t.size, 0);
        void *view = nullptr;
        {
            Anonymous mine(t.size);
            char *base = static_cast<char *>(mine.base);
            if (read_moments(w, group, reinterpret_cast<float *>(base),
                             reinterpret_cast<float *>(base + t.exp_avg_sq))) {
                if (step) state_out(w, group, nullptr); // the step count: a round trip
                view = mine.release();
            }
        }
        if (!view) view = take_through_segment(w, group, t.size);
        *state = new (std::nothrow) zb_worker_state{view, t.size};
        if (!*state) {
            munmap(view, t.size);
            fail(ZB_ENOMEM, "zb_worker_group_take_state: out of memory");
        }
        *exp_avg = static_cast<float *>(view);
        *exp_avg_sq = reinterpret_cast<float *>(static_cast<char *>(view) + t.exp_avg_sq);
        if (step) *step = w.ctl->state_step;
    });
}

void zb_worker_state_release(zb_worker_state_t *state) {
    if (!state) return;
    munmap(state->base, state->size);
    delete state;
}

zb_status zb_worker_group_set_state(zb_worker_t *worker, unsigned group, const float *exp_avg,
                                    const float *exp_avg_sq, int64_t step) {
    return zb::guard([&] {
        const char *fn = "zb_worker_group_set_state";
        const zb_worker &w = state_handle(worker, group, fn);
        const zb_state_range whole{0, w.descs[group].numel, exp_avg, exp_avg_sq};
        const bool any = exp_avg || exp_avg_sq;
        load_state(worker, group, any ? &whole : nullptr, any ? 1 : 0, step, fn);
    });
}

zb_status zb_worker_group_load_state(zb_worker_t *worker, unsigned group,
                                     const zb_state_range *ranges, size_t count, int64_t step) {
    return zb::guard(
        [&] { load_state(worker, group, ranges, count, step, "zb_worker_group_load_state"); });
}

} // extern "C"
