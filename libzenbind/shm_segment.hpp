// A shared-memory segment that cannot SIGBUS: an anonymous memfd (no name another user can open,
// gone when its last fd and mapping are), placed on preferred NUMA nodes, with every page reserved
// at creation by fallocate and its size sealed. A memory or file-size limit therefore fails here,
// as ZB_ENOMEM, and never as a fault in the middle of training. A forked child of this process gets
// the segment copy-on-write, never shared (shm_fork.hpp).
#pragma once

#include <cstddef>
#include <vector>

namespace zb::shm {

// A job under Slurm's ConstrainRAMSpace runs in a memory cgroup: memory it cannot hold would not
// fail when reserved but get the trainer or the worker OOM-killed later. Refuses (ZB_ENOMEM) `size`
// bytes of `kind` ("shared memory", "memory") for `what`, plus `worker_bytes` the worker will
// allocate, beyond the cgroup's headroom, while nothing is lost; no limit, nothing refused.
void check_memory_cgroup(const char *kind, const char *what, size_t size, size_t worker_bytes);

class Segment {
  public:
    Segment() = default;
    // `what` names the segment in error messages; `nodes` may be empty (no placement).
    // `worker_bytes` is what the worker will allocate privately for it (a group's Adam moments):
    // the job's memory cgroup must hold both, or the segment is refused (ZB_ENOMEM) before anything
    // is reserved.
    Segment(const char *what, size_t size, const std::vector<int> &nodes, size_t worker_bytes = 0);
    ~Segment();
    Segment(Segment &&other) noexcept;
    Segment &operator=(Segment &&other) noexcept;
    Segment(const Segment &) = delete;
    Segment &operator=(const Segment &) = delete;

    int fd() const { return fd_; }
    void *base() const { return base_; }
    size_t size() const { return size_; }
    // Bytes the kernel has allocated to the memfd (st_blocks), for the memory report.
    size_t allocated() const;

  private:
    void release() noexcept;
    int fd_ = -1;
    void *base_ = nullptr;
    size_t size_ = 0;
};

} // namespace zb::shm
