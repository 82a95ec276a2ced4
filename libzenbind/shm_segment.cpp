#include "shm_segment.hpp"

#include "error.hpp"
#include "shm_fork.hpp"

#include <zenbind/zenbind.h>

#include <zbproto/layout.hpp>
#include <zbproto/numa.hpp>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zb::shm {

namespace {

[[noreturn]] void fail_reserve(const char *what, size_t size, int err) {
    const std::string head = std::string("cannot reserve ") + std::to_string(size) +
                             " bytes of shared memory for the " + what + ": " + std::strerror(err);
    if (err == ENOSPC || err == ENOMEM || err == EFBIG || err == EDQUOT)
        fail(ZB_ENOMEM, head + " (a memory cgroup, tmpfs or RLIMIT_FSIZE limit refused it)");
    fail(ZB_ESYS, head);
}

// Allocates [offset, offset + size) of the file, 0 or an errno, with this thread's catchable
// signals held back meanwhile: tmpfs before Linux 6.12 gave up with EINTR on any pending signal
// (a profiler's timer, Python's SIGINT, a trainer's SIGUSR1) and freed what it had allocated, so
// that neither failing nor asking again would do under a signal that comes often. Held back, a
// signal is handled once the reservation is done; SIGKILL still ends it.
int reserve(int fd, uint64_t offset, uint64_t size) {
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    const int err = posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(size));
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    return err;
}

// Past RLIMIT_FSIZE, ftruncate would raise SIGXFSZ, which kills the caller by default. `size`
// bytes are asked for a file that would then end at `end` (the groups' Arena shares one file, so
// the limit bounds them together, and the refusal says so).
void check_file_size(const char *what, uint64_t size, uint64_t end) {
    rlimit fsize{};
    if (getrlimit(RLIMIT_FSIZE, &fsize) != 0 || fsize.rlim_cur == RLIM_INFINITY ||
        end <= fsize.rlim_cur)
        return;
    if (end == size) fail_reserve(what, size, EFBIG);
    fail(ZB_ENOMEM, "cannot reserve " + std::to_string(size) + " bytes of shared memory for the " +
                        what + ": with the groups before it, " + std::to_string(end) +
                        " bytes, past RLIMIT_FSIZE (" + std::to_string(fsize.rlim_cur) +
                        " bytes: ulimit -f)");
}

std::string mib(uint64_t bytes) {
    return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB";
}

} // namespace

void check_memory_cgroup(const char *kind, const char *what, size_t size, size_t worker_bytes) {
    uint64_t headroom = 0, limit = 0, in_use = 0;
    char source[4096];
    if (zb_cgroup_memory_headroom(nullptr, 0, &headroom, &limit, &in_use, source, sizeof source) !=
        ZB_OK)
        return; // no limit applies (or it cannot be read: nothing to hold the request against)
    const uint64_t need = uint64_t(size) + worker_bytes;
    if (need <= headroom) return;
    fail(ZB_ENOMEM,
         std::string("cannot reserve ") + mib(size) + " of " + kind + " for the " + what +
             (worker_bytes ? " and " + mib(worker_bytes) + " of Adam moments in the worker" : "") +
             ": the job's memory cgroup allows " + mib(headroom) + " more (limit " + mib(limit) +
             " in " + source + ", " + mib(in_use) + " in use)");
}

Segment::Segment(const char *what, size_t size, const std::vector<int> &nodes, size_t worker_bytes)
    : size_(size) {
    check_memory_cgroup("shared memory", what, size, worker_bytes);
    fd_ = memfd_create(what, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0) fail_errno(std::string("memfd_create for the ") + what);
    try {
        check_file_size(what, size, size);
        if (ftruncate(fd_, static_cast<off_t>(size)) != 0) fail_reserve(what, size, errno);
        base_ = map_shared(fd_, size);
        if (!base_) fail_errno(std::string("mmap of the ") + what);
        // The shared policy of the memfd's pages, set before fallocate allocates them.
        proto::prefer_nodes(base_, size, nodes.data(), nodes.size());
        if (const int err = reserve(fd_, 0, size)) fail_reserve(what, size, err);
        if (fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
            fail_errno(std::string("sealing the ") + what);
    } catch (...) {
        release();
        throw;
    }
}

Segment::~Segment() {
    release();
}

Segment::Segment(Segment &&other) noexcept
    : fd_(other.fd_), base_(other.base_), size_(other.size_) {
    other.fd_ = -1;
    other.base_ = nullptr;
    other.size_ = 0;
}

Segment &Segment::operator=(Segment &&other) noexcept {
    if (this != &other) {
        release();
        fd_ = other.fd_;
        base_ = other.base_;
        size_ = other.size_;
        other.fd_ = -1;
        other.base_ = nullptr;
        other.size_ = 0;
    }
    return *this;
}

namespace {

size_t allocated_to(int fd) {
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) return 0;
    return static_cast<size_t>(st.st_blocks) * 512;
}

} // namespace

size_t Segment::allocated() const {
    return allocated_to(fd_);
}

void Segment::release() noexcept {
    if (base_) unmap_shared(base_, size_);
    if (fd_ >= 0) close(fd_);
    base_ = nullptr;
    fd_ = -1;
}

Region::~Region() {
    unmap();
}

Region::Region(Region &&other) noexcept
    : base_(other.base_), size_(other.size_), offset_(other.offset_) {
    other.base_ = nullptr;
    other.size_ = 0;
}

Region &Region::operator=(Region &&other) noexcept {
    if (this != &other) {
        unmap();
        base_ = other.base_;
        size_ = other.size_;
        offset_ = other.offset_;
        other.base_ = nullptr;
        other.size_ = 0;
    }
    return *this;
}

void Region::unmap() noexcept {
    if (base_) unmap_shared(base_, size_);
    base_ = nullptr;
}

Arena::~Arena() {
    if (fd_ >= 0) close(fd_);
}

Region Arena::add(size_t size, const std::vector<int> &nodes, size_t worker_bytes) {
    // A range's offset must be a multiple of the system's page for mmap (64 KiB on some arm64
    // kernels), and its buffers are laid out on proto::kPage.
    const long system_page = sysconf(_SC_PAGESIZE);
    const uint64_t page = system_page > long(proto::kPage) ? uint64_t(system_page) : proto::kPage;
    size = (size + page - 1) / page * page;
    check_memory_cgroup("shared memory", what_, size, worker_bytes);
    if (fd_ < 0) {
        const int fd = memfd_create(what_, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0) fail_errno(std::string("memfd_create for the ") + what_);
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
            const int err = errno;
            close(fd);
            errno = err;
            fail_errno(std::string("sealing the ") + what_);
        }
        fd_ = fd;
    }
    const uint64_t end = end_ + size;
    if (end > file_size_) {
        check_file_size(what_, size, end);
        if (ftruncate(fd_, static_cast<off_t>(end)) != 0) fail_reserve(what_, size, errno);
        file_size_ = end;
    }
    Region r;
    r.offset_ = end_;
    r.base_ = map_shared(fd_, size, static_cast<off_t>(r.offset_));
    if (!r.base_) fail_errno(std::string("mmap of the ") + what_);
    r.size_ = size;
    // The shared policy of the range's pages, set before fallocate allocates them.
    proto::prefer_nodes(r.base_, size, nodes.data(), nodes.size());
    if (const int err = reserve(fd_, r.offset_, size)) {
        end_ = end; // give_back frees what fallocate allocated before it failed
        give_back(std::move(r));
        fail_reserve(what_, size, err);
    }
    end_ = end;
    return r;
}

void Arena::give_back(Region &&newest) noexcept {
    const uint64_t offset = newest.offset_, size = newest.size_;
    newest.unmap();
    newest.size_ = 0;
    if (fd_ < 0 || size == 0) return;
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(size));
    if (offset + size == end_) end_ = offset;
}

size_t Arena::allocated() const {
    return allocated_to(fd_);
}

} // namespace zb::shm
