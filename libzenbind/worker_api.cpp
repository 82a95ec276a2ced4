// The per-step API of the worker: parameter groups, submit/wait, memory and thread reports. Every
// entry point validates its arguments before touching shared memory.
#include "error.hpp"
#include "hyper_check.hpp"
#include "worker_handle.hpp"
#include <zbutil/proc_status.hpp>

#include <zbadam/adam.hpp>
#include <zbproto/fd_passing.hpp>
#include <zbproto/group.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <sys/mman.h>

#include <omp.h>

namespace {

using zb::check_hyper;
using zb::fail;
namespace proto = zb::proto;

// The public header states the protocol's values and limits; the protocol module is their source.
static_assert(ZB_STEP_SKIP_NONFINITE == proto::kStepSkipNonfinite &&
              ZB_STEP_GRAD_NORM == proto::kStepGradNorm);
static_assert(ZB_DTYPE_NONE == int(proto::Dtype::none) && ZB_DTYPE_FP32 == int(proto::Dtype::f32) &&
              ZB_DTYPE_BF16 == int(proto::Dtype::bf16) && ZB_DTYPE_FP16 == int(proto::Dtype::f16));
static_assert(ZB_WORKER_MAX_GROUPS == proto::kMaxGroups &&
              ZB_WORKER_MAX_THREADS == proto::kMaxThreads &&
              ZB_WORKER_MAX_NODES == proto::kMaxNodes);

zb_worker &handle(zb_worker *w, const char *fn) {
    if (!w) fail(ZB_EINVAL, std::string(fn) + ": worker is NULL");
    // Before anything is written: a forked child's control block and segments are its private
    // copies, but its socket and futex wakes would still reach the worker.
    if (w->forked())
        fail(ZB_EINVAL, std::string(fn) + ": this worker belongs to process " +
                            std::to_string(w->owner) + "; a forked child cannot use it (this is " +
                            "process " + std::to_string(getpid()) + ")");
    return *w;
}

// A C caller may store any int in an enum field; read it as an int, without assuming a valid value.
int raw(const zb_dtype &field) {
    int v;
    std::memcpy(&v, &field, sizeof v);
    return v;
}

proto::Hyper to_shm(const zb_adam_hyper &h) {
    return proto::Hyper{h.lr,
                        h.beta1,
                        h.beta2,
                        h.eps,
                        h.weight_decay,
                        static_cast<uint32_t>(h.adamw),
                        static_cast<uint32_t>(h.bias_correction),
                        0};
}

} // namespace

namespace zb::worker_client {

zb_worker &state_handle(zb_worker *worker, unsigned group, const char *fn) {
    zb_worker &w = handle(worker, fn);
    w.check_alive();
    if (w.in_flight) fail(ZB_EINVAL, std::string(fn) + ": a step is in flight; wait first");
    if (group >= w.groups.size())
        fail(ZB_EINVAL, std::string(fn) + ": unknown group " + std::to_string(group) + " (" +
                            std::to_string(w.groups.size()) + " registered)");
    return w;
}

void send_segment(zb_worker &w, int fd, uint32_t tag, const char *what) {
    if (const int err = proto::send_fd(w.sock, fd, tag)) {
        if (err == EPIPE || err == ECONNRESET || err == ECONNREFUSED) {
            // The worker's end of the socket closed: it died (the OOM killer, choosing it while
            // this call reserved memory); its pidfd turns readable a moment after.
            w.check_gone();
        }
        errno = err;
        zb::fail_errno(std::string("sending the ") + what + " to the worker");
    }
}

} // namespace zb::worker_client

using zb::worker_client::send_segment;
using zb::worker_client::state_handle;

extern "C" {

void zb_adam_hyper_init(zb_adam_hyper *h) {
    if (!h) return;
    const zb::opt::AdamHyper d{}; // the defaults' one definition
    *h = zb_adam_hyper{
        d.lr, d.beta1, d.beta2, d.eps, d.weight_decay, d.adamw ? 1 : 0, d.bias_correction ? 1 : 0};
}

zb_status zb_worker_group_add(zb_worker_t *worker, const zb_group_attr *attr, unsigned *group) {
    return zb::guard([&] {
        zb_worker &w = handle(worker, "zb_worker_group_add");
        if (!attr || !group) fail(ZB_EINVAL, "zb_worker_group_add: attr or group is NULL");
        w.check_alive();
        if (w.in_flight) fail(ZB_EINVAL, "zb_worker_group_add: a step is in flight; wait first");
        if (w.groups.size() >= proto::kMaxGroups)
            fail(ZB_EINVAL,
                 "zb_worker_group_add: at most " + std::to_string(proto::kMaxGroups) + " groups");
        if (attr->numel == 0 || attr->numel > (size_t(1) << 40))
            fail(ZB_EINVAL, "zb_worker_group_add: numel must be from 1 to 2^40");
        const int grad = raw(attr->grad), copy = raw(attr->copy_out);
        if (grad != ZB_DTYPE_FP32 && grad != ZB_DTYPE_BF16 && grad != ZB_DTYPE_FP16)
            fail(ZB_EINVAL, "zb_worker_group_add: grad must be ZB_DTYPE_FP32, BF16 or FP16");
        if (copy != ZB_DTYPE_NONE && copy != ZB_DTYPE_BF16 && copy != ZB_DTYPE_FP16)
            fail(ZB_EINVAL, "zb_worker_group_add: copy_out must be ZB_DTYPE_NONE, BF16 or FP16");
        if (attr->flags & ~(ZB_GROUP_STALE | ZB_GROUP_ONE_GRAD_BUFFER))
            fail(ZB_EINVAL, "zb_worker_group_add: unknown flags " + std::to_string(attr->flags));
        const bool stale = attr->flags & ZB_GROUP_STALE;
        const unsigned buffers = attr->flags & ZB_GROUP_ONE_GRAD_BUFFER ? 1 : 2;
        check_hyper(attr->hyper, "zb_worker_group_add: hyper");

        const auto g = static_cast<uint32_t>(w.groups.size());
        const size_t n = attr->numel;
        proto::GroupDesc d = proto::lay_out_group(n, static_cast<proto::Dtype>(grad),
                                                  static_cast<proto::Dtype>(copy), stale, buffers);
        d.hyper = to_shm(attr->hyper);
        // The worker allocates the group's two moments, page-rounded, when it registers it.
        zb::shm::Region region =
            w.group_memory.add(d.segment_size, w.mems, 2 * proto::page_round(4 * n));
        try {
            // nothing may throw once the worker has the group
            w.moments.reserve(w.groups.size() + 1);
            w.descs.reserve(w.groups.size() + 1);
            w.groups.reserve(w.groups.size() + 1);
            const std::string what =
                "register group " + std::to_string(g) + " (" + std::to_string(n) + " parameters)";
            d.segment_offset = region.offset();
            w.ctl->groups[g] = d;
            send_segment(w, w.group_memory.fd(), g, "group's shared memory");
            w.ctl->command = proto::Command::add_group;
            w.ctl->ngroups = g;
            w.run_state_command(what);
        } catch (...) {
            w.group_memory.give_back(std::move(region)); // the worker did not keep it
            throw;
        }
        w.groups.push_back(std::move(region));
        w.moments.push_back(w.ctl->moments);
        w.descs.push_back(d);
        *group = g;
    });
}

zb_status zb_worker_group_remove(zb_worker_t *worker, unsigned group) {
    return zb::guard([&] {
        zb_worker &w = state_handle(worker, group, "zb_worker_group_remove");
        if (group + 1 != w.groups.size())
            fail(ZB_EINVAL, "zb_worker_group_remove: group " + std::to_string(group) +
                                " is not the newest (" + std::to_string(w.groups.size()) +
                                " registered): groups go newest first");
        w.ctl->command = proto::Command::remove_group;
        w.ctl->ngroups = group;
        w.run_state_command("remove group " + std::to_string(group));
        w.group_memory.give_back(std::move(w.groups.back()));
        w.groups.pop_back();
        w.moments.pop_back();
        w.descs.pop_back();
    });
}

zb_status zb_worker_group_buffers(zb_worker_t *worker, unsigned group, zb_group_buffers *out) {
    return zb::guard([&] {
        zb_worker &w = handle(worker, "zb_worker_group_buffers");
        if (!out) fail(ZB_EINVAL, "zb_worker_group_buffers: out is NULL");
        if (group >= w.groups.size())
            fail(ZB_EINVAL, "zb_worker_group_buffers: unknown group " + std::to_string(group) +
                                " (" + std::to_string(w.groups.size()) + " registered)");
        const proto::GroupDesc &d = w.descs[group];
        char *base = static_cast<char *>(w.groups[group].base());
        out->numel = d.numel;
        out->params = reinterpret_cast<float *>(base + d.off_params);
        out->grads[0] = base + d.off_grads[0];
        out->grads[1] = d.off_grads[1] ? base + d.off_grads[1] : nullptr;
        out->copy_out = d.off_copy ? base + d.off_copy : nullptr;
        out->stale = d.off_stale ? reinterpret_cast<float *>(base + d.off_stale) : nullptr;
        out->grad = static_cast<zb_dtype>(d.grad);
        out->copy = static_cast<zb_dtype>(d.copy);
    });
}

namespace {

// zb_worker_submit and zb_worker_submit_groups: a step over groups [first, first + count).
void submit_groups(zb_worker_t *worker, const zb_worker_step *step, unsigned first, size_t count,
                   const char *fn) {
    const std::string f = fn;
    zb_worker &w = handle(worker, fn);
    if (!step) fail(ZB_EINVAL, f + ": step is NULL");
    w.check_alive();
    if (w.in_flight)
        fail(ZB_EINVAL, f + ": a step is already in flight; call zb_worker_wait_result");
    if (step->step < 0) fail(ZB_EINVAL, f + ": step must be >= 0");
    if (step->flags & ~(ZB_STEP_SKIP_NONFINITE | ZB_STEP_GRAD_NORM))
        fail(ZB_EINVAL, f + ": unknown flags " + std::to_string(step->flags));
    if (!std::isfinite(step->max_grad_norm) || step->max_grad_norm < 0)
        fail(ZB_EINVAL, f + ": max_grad_norm must be finite and >= 0");
    if (step->grad_buffer > 1) fail(ZB_EINVAL, f + ": grad_buffer must be 0 or 1");
    if (!std::isfinite(step->grad_scale)) fail(ZB_EINVAL, f + ": grad_scale must be finite");
    const size_t ngroups = w.groups.size();
    if (first > ngroups || count > ngroups - first)
        fail(ZB_EINVAL, f + ": groups " + std::to_string(first) + " to " +
                            std::to_string(first + count) + " (exclusive) are not registered (" +
                            std::to_string(ngroups) + " are)");
    for (size_t g = first; g < first + count; ++g)
        if (w.descs[g].off_grads[step->grad_buffer] == 0)
            fail(ZB_EINVAL, f + ": group " + std::to_string(g) +
                                " has one gradient buffer (ZB_GROUP_ONE_GRAD_BUFFER): grad_buffer "
                                "must be 0");
    if (step->hypers) {
        if (step->nhypers != count)
            fail(ZB_EINVAL, f + ": nhypers is " + std::to_string(step->nhypers) +
                                ", but the step "
                                "covers " +
                                std::to_string(count) + " groups");
        for (size_t g = 0; g < count; ++g)
            check_hyper(step->hypers[g], f + ": hypers[" + std::to_string(g) + "]");
        for (size_t g = 0; g < count; ++g)
            w.ctl->groups[first + g].hyper = to_shm(step->hypers[g]);
    }
    w.ctl->command = proto::Command::step;
    w.ctl->first_group = first;
    w.ctl->ngroups = static_cast<uint32_t>(count);
    w.ctl->step = step->step;
    w.ctl->grad_scale = step->grad_scale;
    w.ctl->grad_buffer = step->grad_buffer;
    w.ctl->flags = step->flags;
    w.ctl->max_grad_norm = step->max_grad_norm;
    w.publish_request();
    w.in_flight = true;
}

} // namespace

zb_status zb_worker_submit(zb_worker_t *worker, const zb_worker_step *step) {
    return zb::guard([&] {
        const size_t all = worker ? handle(worker, "zb_worker_submit").groups.size() : 0;
        submit_groups(worker, step, 0, all, "zb_worker_submit");
    });
}

zb_status zb_worker_submit_groups(zb_worker_t *worker, const zb_worker_step *step, unsigned first,
                                  unsigned count) {
    return zb::guard([&] {
        if (count == 0) fail(ZB_EINVAL, "zb_worker_submit_groups: count must be >= 1");
        submit_groups(worker, step, first, count, "zb_worker_submit_groups");
    });
}

zb_status zb_worker_wait_result(zb_worker_t *worker, int timeout_ms, zb_worker_result *out) {
    return zb::guard([&] {
        zb_worker &w = handle(worker, "zb_worker_wait_result");
        if (timeout_ms < 0) fail(ZB_EINVAL, "zb_worker_wait_result: timeout_ms must be >= 0");
        if (!w.in_flight) {
            w.check_alive(); // a dead worker is ZB_EDEAD, not "nothing to wait for"
            fail(ZB_EINVAL, "zb_worker_wait_result: no step in flight");
        }
        try {
            w.wait_response(int64_t(timeout_ms) * 1'000'000);
        } catch (const zb::Error &e) {
            if (e.status() != ZB_ETIMEDOUT) w.in_flight = false;
            throw;
        }
        w.in_flight = false;
        if (out)
            *out = zb_worker_result{w.ctl->nonfinite, w.ctl->grad_norm, w.ctl->skipped ? 1 : 0,
                                    static_cast<double>(w.ctl->step_ns) * 1e-9};
    });
}

zb_status zb_worker_group_set_ranges(zb_worker_t *worker, unsigned group,
                                     const zb_step_range *ranges, size_t count) {
    static_assert(sizeof(zb_step_range) == sizeof(proto::StepRange) &&
                  offsetof(zb_step_range, idle) == offsetof(proto::StepRange, idle));
    return zb::guard([&] {
        zb_worker &w = state_handle(worker, group, "zb_worker_group_set_ranges");
        if (count && !ranges) fail(ZB_EINVAL, "zb_worker_group_set_ranges: ranges is NULL");
        if (count > w.descs[group].numel)
            fail(ZB_EINVAL, "zb_worker_group_set_ranges: more ranges than the group has elements");
        std::optional<zb::shm::Segment> seg;
        if (count) {
            seg.emplace("zenflow step ranges", count * sizeof(zb_step_range), w.mems);
            std::memcpy(seg->base(), ranges, count * sizeof(zb_step_range));
            send_segment(w, seg->fd(), group, "step ranges' shared memory");
        }
        w.ctl->command = proto::Command::set_ranges;
        w.ctl->ngroups = group;
        w.ctl->step = static_cast<int64_t>(count);
        w.ctl->transfer = seg ? proto::Transfer::segment : proto::Transfer::none;
        w.run_state_command("set the step ranges of group " + std::to_string(group));
    });
}

zb_status zb_worker_memory_usage(zb_worker_t *worker, zb_worker_memory *out) {
    return zb::guard([&] {
        zb_worker &w = handle(worker, "zb_worker_memory_usage");
        if (!out) fail(ZB_EINVAL, "zb_worker_memory_usage: out is NULL");
        using zb::util::proc_status_bytes;
        zb_worker_memory m{};
        m.shm_reserved = w.control.allocated() + w.group_memory.allocated();
        for (size_t g = 0; g < w.groups.size(); ++g) { // what each registered group's layout needs
            const proto::GroupDesc &d = w.descs[g];
            const size_t n = d.numel, buffers = d.off_grads[1] ? 2 : 1;
            m.numel += n;
            m.params += 4 * n;
            m.grads += buffers * proto::dtype_size(d.grad) * n;
            m.copy_out += proto::dtype_size(d.copy) * n;
            m.stale += d.stale ? 4 * n : 0;
        }
        m.moments = 8 * m.numel;
        m.bytes_per_param =
            m.numel
                ? double(m.params + m.grads + m.copy_out + m.stale + m.moments) / double(m.numel)
                : 0.0;
        if (!w.reaped) {
            m.worker_rss = proc_status_bytes(w.pid, "VmRSS");
            m.worker_rss_anon = proc_status_bytes(w.pid, "RssAnon");
            m.worker_rss_shmem = proc_status_bytes(w.pid, "RssShmem");
        }
        m.trainer_rss = proc_status_bytes(0, "VmRSS");
        m.trainer_rss_anon = proc_status_bytes(0, "RssAnon");
        m.trainer_rss_shmem = proc_status_bytes(0, "RssShmem");
        *out = m;
    });
}

zb_status zb_worker_pid(const zb_worker_t *w, pid_t *pid) {
    return zb::guard([&] {
        if (!w || !pid) fail(ZB_EINVAL, "zb_worker_pid: worker or pid is NULL");
        *pid = w->pid;
    });
}

zb_status zb_worker_threads(const zb_worker_t *w, unsigned *count) {
    return zb::guard([&] {
        if (!w || !count) fail(ZB_EINVAL, "zb_worker_threads: worker or count is NULL");
        *count = w->nthreads;
    });
}

zb_status zb_worker_thread(const zb_worker_t *w, unsigned index, pid_t *tid, int *cpu) {
    return zb::guard([&] {
        if (!w || !tid || !cpu) fail(ZB_EINVAL, "zb_worker_thread: worker, tid or cpu is NULL");
        if (index >= w->nthreads)
            fail(ZB_EINVAL, "zb_worker_thread: index " + std::to_string(index) +
                                " >= " + std::to_string(w->nthreads) + " threads");
        *tid = w->ctl->tids[index];
        *cpu = w->ctl->thread_cpus[index];
    });
}
}
