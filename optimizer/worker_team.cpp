#include "worker_team.hpp"

#include "adam.hpp"

#include <zbproto/fd_passing.hpp>
#include <zbproto/futex.hpp>
#include <zbproto/group.hpp>
#include <zbproto/numa.hpp>
#include <zenbind/zenbind.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <omp.h>
#include <poll.h>
#include <sched.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace zf::worker {
namespace {

namespace proto = zb::proto;

// One parameter group. Each thread updates its adam_slice of every group, so a thread's share of a
// group's moments is the share it zeroed (first touch) when the group was added: NUMA-local on
// every node of the optimizer's CPUs, whatever groups come before or after. (One kernel call over
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
};

// What the whole team does once the master has taken a command. Commands the master answers on
// its own (errors, empty steps) never wake the team.
enum class Work { answered, step, zero_moments, exit };

struct Team {
    proto::Control &ctl;
    int sock;
    int parent;
    std::vector<Group> groups; // capacity reserved: no reallocation, pointers stay valid
    Work work = Work::answered;
    uint32_t seq = 0; // the request being served
    std::atomic<uint64_t> nonfinite{0};
    std::chrono::steady_clock::time_point step_start;

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

// Master only: receive and map the group's segment, reserve its moments. The team then zeroes
// the moments, each thread its own slice, so that first touch places them next to their users.
Work add_group(Team &t) {
    uint32_t index = 0;
    const int fd = proto::receive_fd(t.sock, index);
    if (fd < 0) {
        t.answer(ZB_EINTERNAL, "no shared-memory fd arrived with the group");
        return Work::answered;
    }
    struct stat st {};
    const bool known = index < proto::kMaxGroups && index == t.ctl.ngroups &&
                       index == t.groups.size() && fstat(fd, &st) == 0 && st.st_size > 0;
    const proto::GroupDesc d = known ? t.ctl.groups[index] : proto::GroupDesc{};
    const size_t n = d.numel;
    if (!known || proto::group_fits(d, static_cast<uint64_t>(st.st_size))) {
        close(fd);
        t.answer(ZB_EINTERNAL, "the group's descriptor does not match its shared memory");
        return Work::answered;
    }
    void *base = mmap(nullptr, d.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
    g.grad = grad_type(d.grad);
    g.copy = copy_type(d.copy);
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
    added.grads[1] = g.base + d.off_grads[1];
    return Work::zero_moments;
}

// Master only: copy this step's hyperparameters and gradient buffer into the tensors.
Work prepare_step(Team &t) {
    const proto::Control &ctl = t.ctl;
    if (t.groups.empty()) { // a round trip with nothing to update
        t.ctl.nonfinite = 0;
        t.ctl.step_ns = 0;
        t.answer(ZB_OK, "");
        return Work::answered;
    }
    if (ctl.ngroups != t.groups.size()) {
        t.answer(ZB_EINTERNAL, "the trainer and the worker disagree on the number of groups");
        return Work::answered;
    }
    for (size_t i = 0; i < t.groups.size(); ++i) {
        Group &g = t.groups[i];
        const proto::GroupDesc &d = ctl.groups[i];
        g.hyper.lr = d.hyper.lr;
        g.hyper.beta1 = d.hyper.beta1;
        g.hyper.beta2 = d.hyper.beta2;
        g.hyper.eps = d.hyper.eps;
        g.hyper.weight_decay = d.hyper.weight_decay;
        g.hyper.adamw = d.hyper.adamw != 0;
        g.hyper.bias_correction = d.hyper.bias_correction != 0;
        g.hyper.step = ctl.step;
        g.hyper.grad_scale = ctl.grad_scale;
        g.tensor.grad = g.grads[ctl.grad_buffer & 1];
    }
    t.nonfinite.store(0, std::memory_order_relaxed);
    return Work::step;
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
    case proto::Command::none:
        break;
    }
    t.answer(ZB_EINTERNAL, "unknown command");
    return Work::answered;
}

// Master only: bounded sleeps on req_seq, checking between them that the trainer lives.
proto::Command next_command(Team &t) {
    const uint32_t seen = t.seq;
    const int64_t spin = int64_t(t.ctl.worker_spin_us) * 1000;
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
    Team t{ctl, socket_fd, parent_pidfd, {}, Work::answered, 0, {0}, {}};
    t.groups.reserve(proto::kMaxGroups);
    const int threads = static_cast<int>(ctl.nthreads);
    if (threads < 1 || ctl.nthreads > proto::kMaxThreads) {
        ctl.status = ZB_EINVAL;
        std::snprintf(ctl.message, sizeof ctl.message, "bad thread count %u", ctl.nthreads);
        publish_ready(ctl, proto::Ready::failed);
        return proto::Exit::failure;
    }
    std::atomic<int> pin_failures{0};
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
#pragma omp master
        {
            const std::string problem = team_problem(threads, pin_failures.load());
            if (problem.empty()) {
                publish_ready(ctl, proto::Ready::ready);
            } else {
                ctl.status = ZB_EINVAL;
                std::snprintf(ctl.message, sizeof ctl.message, "%s", problem.c_str());
                t.work = Work::exit;
                publish_ready(ctl, proto::Ready::failed);
            }
        }
        for (;;) {
#pragma omp master
            {
                while (t.work != Work::exit) {
                    const proto::Command command = next_command(t);
                    t.step_start = std::chrono::steady_clock::now();
                    t.work = serve(t, command);
                    if (t.work != Work::answered) break;
                }
            }
#pragma omp barrier
            // Read between the two barriers: the master writes t.work only outside them.
            const Work work = t.work;
            if (work == Work::exit) break;
            switch (work) {
            case Work::step: {
                uint64_t bad = 0;
                for (const Group &g : t.groups)
                    bad += adam_step_in_team(AdamBatch{g.grad, g.copy, &g.tensor, 1});
                t.nonfinite.fetch_add(bad, std::memory_order_relaxed);
                break;
            }
            case Work::zero_moments:
                zero_slice(t.groups.back(), me, threads);
                break;
            case Work::answered:
            case Work::exit:
                break;
            }
#pragma omp barrier
#pragma omp master
            {
                if (work == Work::step) {
                    ctl.nonfinite = t.nonfinite.load(std::memory_order_relaxed);
                    ctl.step_ns =
                        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::steady_clock::now() - t.step_start)
                                                  .count());
                }
                t.answer(ZB_OK, "");
            }
        }
    }
    return proto::Exit::ok;
}

} // namespace zf::worker
