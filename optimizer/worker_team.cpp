#include "worker_team.hpp"

#include "adam.hpp"
#include "shm_futex.hpp"

#include <zenbind/zenbind.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numaif.h>
#include <omp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace zf::worker {
namespace {

namespace shm = zb::shm;

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

struct Team {
    shm::Control &ctl;
    int sock;
    int parent;
    std::vector<Group> groups; // capacity reserved: no reallocation, pointers stay valid
    shm::Command job = shm::Command::none;
    uint32_t seq = 0; // the request being served
    std::atomic<uint64_t> nonfinite{0};
    std::chrono::steady_clock::time_point step_start;

    void answer(zb_status status, const char *message) {
        ctl.status = status;
        std::snprintf(ctl.message, sizeof ctl.message, "%s", message);
        shm::publish(ctl.done_seq, ctl.trainer_sleeping, seq);
    }
};

GradType grad_type(shm::Dtype grad) {
    return grad == shm::Dtype::bf16  ? GradType::bf16
           : grad == shm::Dtype::f16 ? GradType::f16
                                     : GradType::f32;
}

CopyType copy_type(shm::Dtype copy) {
    return copy == shm::Dtype::bf16  ? CopyType::bf16
           : copy == shm::Dtype::f16 ? CopyType::f16
                                     : CopyType::none;
}

void prefer_nodes(void *p, size_t len, const shm::Control &ctl) {
    constexpr int kMaskBits = 1024;
    const uint32_t nmems = ctl.nmems < shm::kMaxNodes ? ctl.nmems : shm::kMaxNodes;
    if (nmems == 0 || ctl.mems[0] < 0 || ctl.mems[0] >= kMaskBits) return;
    unsigned long mask[kMaskBits / (8 * sizeof(unsigned long))] = {};
    const unsigned long bits = 8 * sizeof(unsigned long);
    for (uint32_t i = 0; i < nmems; ++i)
        if (ctl.mems[i] >= 0 && ctl.mems[i] < kMaskBits)
            mask[ctl.mems[i] / bits] |= 1UL << (ctl.mems[i] % bits);
    if (nmems > 1 && mbind(p, len, MPOL_PREFERRED_MANY, mask, kMaskBits, 0) == 0) return;
    unsigned long first[1024 / (8 * sizeof(unsigned long))] = {};
    first[ctl.mems[0] / bits] |= 1UL << (ctl.mems[0] % bits);
    mbind(p, len, MPOL_PREFERRED, first, kMaskBits, 0); // placement is an optimisation only
}

// [off, off + bytes) lies inside a segment of `size` bytes, 64-byte aligned (a vector's width).
bool fits(uint64_t off, uint64_t bytes, uint64_t size) {
    return off % 64 == 0 && off <= size && bytes <= size - off;
}

// The group's descriptor as the trainer wrote it must describe its segment exactly: the worker
// writes through every offset, so nothing is taken on trust (sizes cannot overflow: n is at most
// a quarter of the segment's size).
bool describes(const shm::GroupDesc &d, uint64_t segment_size) {
    const uint64_t n = d.numel, size = d.segment_size;
    const bool grad_ok =
        d.grad == shm::Dtype::f32 || d.grad == shm::Dtype::bf16 || d.grad == shm::Dtype::f16;
    const bool copy_ok =
        d.copy == shm::Dtype::none || d.copy == shm::Dtype::bf16 || d.copy == shm::Dtype::f16;
    if (size != segment_size || n == 0 || n > size / 4 || !grad_ok || !copy_ok || d.stale > 1)
        return false;
    const uint64_t g = shm::dtype_size(d.grad);
    return fits(d.off_params, 4 * n, size) && fits(d.off_grads[0], g * n, size) &&
           fits(d.off_grads[1], g * n, size) &&
           (d.copy == shm::Dtype::none ? d.off_copy == 0 : fits(d.off_copy, 2 * n, size)) &&
           (d.stale ? fits(d.off_stale, 4 * n, size) : d.off_stale == 0);
}

// Master only: receive and map the group's segment, reserve its moments. The team then zeroes
// the moments, each thread its own slice, so that first touch places them next to their users.
bool add_group(Team &t) {
    char control[CMSG_SPACE(sizeof(int))] = {};
    uint32_t index = 0;
    iovec iov{&index, sizeof index};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t got = recvmsg(t.sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    cmsghdr *c = got == sizeof index ? CMSG_FIRSTHDR(&msg) : nullptr;
    if (!c || c->cmsg_type != SCM_RIGHTS) {
        t.answer(ZB_EINTERNAL, "no shared-memory fd arrived with the group");
        return false;
    }
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    struct stat st {};
    const bool known = index < shm::kMaxGroups && index == t.ctl.ngroups &&
                       index == t.groups.size() && fstat(fd, &st) == 0 && st.st_size > 0;
    const shm::GroupDesc d = known ? t.ctl.groups[index] : shm::GroupDesc{};
    const size_t n = d.numel;
    if (!known || !describes(d, static_cast<uint64_t>(st.st_size))) {
        close(fd);
        t.answer(ZB_EINTERNAL, "the group's descriptor does not match its shared memory");
        return false;
    }
    void *base = mmap(nullptr, d.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int map_err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        t.answer(ZB_ENOMEM,
                 (std::string("cannot map the group: ") + std::strerror(map_err)).c_str());
        return false;
    }
    Group g;
    g.base = static_cast<char *>(base);
    g.size = d.segment_size;
    g.numel = n;
    g.stride = (4 * n + 4095) / 4096 * 1024;
    void *m =
        mmap(nullptr, 8 * g.stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        munmap(base, d.segment_size);
        t.answer(ZB_ENOMEM, ("cannot allocate " + std::to_string(8 * n) +
                             " bytes of Adam moments: " + std::strerror(errno))
                                .c_str());
        return false;
    }
    prefer_nodes(m, 8 * g.stride, t.ctl);
    g.moments = static_cast<float *>(m);
    g.grad = grad_type(d.grad);
    g.copy = copy_type(d.copy);
    AdamTensor &tensor = t.groups.emplace_back(g).tensor;
    tensor.param = reinterpret_cast<float *>(g.base + d.off_params);
    tensor.exp_avg = g.moments;
    tensor.exp_avg_sq = g.moments + g.stride;
    tensor.copy_out = d.off_copy ? g.base + d.off_copy : nullptr;
    tensor.stale = d.off_stale ? reinterpret_cast<float *>(g.base + d.off_stale) : nullptr;
    tensor.n = n;
    tensor.hyper = &t.groups.back().hyper;
    t.groups.back().grads[0] = g.base + d.off_grads[0];
    t.groups.back().grads[1] = g.base + d.off_grads[1];
    return true;
}

// Master only: copy this step's hyperparameters and gradient buffer into the tensors.
bool prepare_step(Team &t) {
    const shm::Control &ctl = t.ctl;
    if (ctl.ngroups != t.groups.size()) {
        t.answer(ZB_EINTERNAL, "the trainer and the worker disagree on the number of groups");
        return false;
    }
    for (size_t i = 0; i < t.groups.size(); ++i) {
        Group &g = t.groups[i];
        const shm::GroupDesc &d = ctl.groups[i];
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
    return true;
}

// Master only: bounded sleeps on req_seq, checking between them that the trainer lives.
shm::Command next_command(Team &t) {
    const uint32_t seen = t.seq;
    const int64_t spin = int64_t(t.ctl.worker_spin_us) * 1000;
    uint32_t v = shm::spin_for_change(t.ctl.req_seq, seen, spin);
    while (v == seen) {
        pollfd p{t.parent, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) return shm::Command::exit; // the trainer died
        v = shm::sleep_for_change(t.ctl.req_seq, t.ctl.worker_sleeping, seen, 50'000'000);
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

} // namespace

int run_team(shm::Control &ctl, int socket_fd, int parent_pidfd) {
    Team t{ctl, socket_fd, parent_pidfd, {}, shm::Command::none, 0, {0}, {}};
    t.groups.reserve(shm::kMaxGroups);
    const int threads = static_cast<int>(ctl.nthreads);
    if (threads < 1 || ctl.nthreads > shm::kMaxThreads) {
        ctl.status = ZB_EINVAL;
        std::snprintf(ctl.message, sizeof ctl.message, "bad thread count %u", ctl.nthreads);
        shm::publish(ctl.ready, ctl.trainer_sleeping, 2);
        return 1;
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
            if (omp_get_num_threads() != threads) {
                ctl.status = ZB_EINVAL;
                std::snprintf(ctl.message, sizeof ctl.message,
                              "OpenMP gave the worker %d of the %d threads asked for (a thread "
                              "limit in its environment?)",
                              omp_get_num_threads(), threads);
                t.job = shm::Command::exit;
                shm::publish(ctl.ready, ctl.trainer_sleeping, 2);
            } else if (pin_failures.load()) {
                ctl.status = ZB_EINVAL;
                std::snprintf(ctl.message, sizeof ctl.message,
                              "%d of %d threads could not pin themselves to their CPU "
                              "(outside this process's cgroup or affinity?)",
                              pin_failures.load(), threads);
                t.job = shm::Command::exit;
                shm::publish(ctl.ready, ctl.trainer_sleeping, 2);
            } else {
                shm::publish(ctl.ready, ctl.trainer_sleeping, 1);
            }
        }
        for (;;) {
#pragma omp master
            {
                // Empty steps and failed preparations are answered without waking the team.
                while (t.job != shm::Command::exit) {
                    t.job = next_command(t);
                    if (t.job == shm::Command::exit) break;
                    t.step_start = std::chrono::steady_clock::now();
                    if (t.job == shm::Command::step && t.groups.empty()) {
                        ctl.nonfinite = 0;
                        ctl.step_ns = 0;
                        t.answer(ZB_OK, "");
                        continue;
                    }
                    if (t.job == shm::Command::step ? prepare_step(t)
                        : t.job == shm::Command::add_group
                            ? add_group(t)
                            : (t.answer(ZB_EINTERNAL, "unknown command"), false))
                        break;
                }
            }
#pragma omp barrier
            // Read between the two barriers: the master writes t.job only outside them.
            const shm::Command job = t.job;
            if (job == shm::Command::exit) break;
            if (job == shm::Command::step) {
                uint64_t bad = 0;
                for (const Group &g : t.groups)
                    bad += adam_step_in_team(AdamBatch{g.grad, g.copy, &g.tensor, 1});
                t.nonfinite.fetch_add(bad, std::memory_order_relaxed);
            } else {
                zero_slice(t.groups.back(), me, threads);
            }
#pragma omp barrier
#pragma omp master
            {
                ctl.nonfinite = t.nonfinite.load(std::memory_order_relaxed);
                ctl.step_ns =
                    static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - t.step_start)
                                              .count());
                t.answer(ZB_OK, "");
            }
        }
    }
    return 0;
}

} // namespace zf::worker
