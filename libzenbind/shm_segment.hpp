// A shared-memory segment that cannot SIGBUS: an anonymous memfd (no name another user can open,
// gone when its last fd and mapping are), placed on preferred NUMA nodes, with every page reserved
// at creation by fallocate and its size sealed. A memory or file-size limit therefore fails here,
// as ZB_ENOMEM, and never as a fault in the middle of training. A forked child of this process gets
// the segment copy-on-write, never shared (shm_fork.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
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

// One range of an Arena, mapped here. Destroying it only unmaps it: its pages stay in the memfd
// until the Arena is given it back, which only the process that owns the worker does (a forked
// child's copy of a handle only unmaps what it inherited; what the child has not written of a
// range given back reads as zeros there, then as the range added in its place).
class Region {
  public:
    Region() = default;
    ~Region();
    Region(Region &&other) noexcept;
    Region &operator=(Region &&other) noexcept;
    Region(const Region &) = delete;
    Region &operator=(const Region &) = delete;

    void *base() const { return base_; }
    size_t size() const { return size_; }
    uint64_t offset() const { return offset_; }

  private:
    friend class Arena;
    void unmap() noexcept;
    void *base_ = nullptr;
    size_t size_ = 0;
    uint64_t offset_ = 0;
};

// Shared memory for many groups in one memfd (a trainer holds one fd for all of them, not one
// each): it grows by a page-aligned Region per group, each placed and reserved as a Segment is, and
// is sealed against shrinking, so that no mapping of it can SIGBUS. The newest Region can be given
// back: its pages are freed and its place is the next one's.
class Arena {
  public:
    explicit Arena(const char *what) : what_(what) {}
    ~Arena();
    Arena(const Arena &) = delete;
    Arena &operator=(const Arena &) = delete;

    // A Region of `size` bytes (page-rounded) after the newest, on `nodes` (may be empty);
    // `worker_bytes` as for a Segment.
    Region add(size_t size, const std::vector<int> &nodes, size_t worker_bytes = 0);
    // Unmaps the newest Region and frees its pages (the worker has unmapped its own mapping, or is
    // gone; a page it still reads reads as zero, never SIGBUS).
    void give_back(Region &&newest) noexcept;
    // -1 until the first Region.
    int fd() const { return fd_; }
    // Bytes the kernel has allocated to the memfd (st_blocks), for the memory report.
    size_t allocated() const;

  private:
    const char *what_;
    int fd_ = -1;
    uint64_t end_ = 0;       // where the next Region begins
    uint64_t file_size_ = 0; // the memfd's size: the largest end_ so far (it never shrinks)
};

} // namespace zb::shm
