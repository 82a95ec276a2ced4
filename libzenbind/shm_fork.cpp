#include "shm_fork.hpp"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>
#include <pthread.h>
#include <sys/mman.h>
#include <vector>

namespace zb::shm {

namespace {

struct Mapping {
    void *base;
    size_t size;
    int fd;
    off_t offset;
};

// The live shared mappings of this process. A mapping is made and recorded, or unmapped and
// forgotten, under the lock, which the fork handlers hold across fork(): the child never sees a
// mapping that is not recorded, nor a record of an address already reused.
struct Registry {
    std::mutex lock;
    std::vector<Mapping> live;
};

// Set once, never freed: a segment may be released during static destruction, and the child
// handler must reach the registry without a guarded static's first-use check.
Registry *registry_ptr = nullptr;

void prepare() noexcept {
    registry_ptr->lock.lock();
}

void parent() noexcept {
    registry_ptr->lock.unlock();
}

// Runs in the child before fork() returns: only system calls, no allocation. A writable private
// mapping may be refused under a strict overcommit policy (it needs commit for a full copy); a
// read-only one needs none. Failing both, the child loses the range rather than share it.
void child() noexcept {
    Registry &r = *registry_ptr;
    for (const Mapping &m : r.live) {
        if (mmap(m.base, m.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, m.fd, m.offset) !=
            MAP_FAILED)
            continue;
        if (mmap(m.base, m.size, PROT_READ, MAP_PRIVATE | MAP_FIXED, m.fd, m.offset) != MAP_FAILED)
            continue;
        munmap(m.base, m.size);
    }
    // The child's mappings are private now: a fork of the child copies them as any private
    // memory, with the child's own writes (clear() keeps the storage, so nothing is freed).
    r.live.clear();
    r.lock.unlock();
}

Registry &registry() {
    static Registry *const r = [] {
        registry_ptr = new Registry; // before the handlers: a fork may run them at once
        if (pthread_atfork(prepare, parent, child) != 0) {
            delete registry_ptr;
            registry_ptr = nullptr;
            throw std::bad_alloc(); // its only failure is ENOMEM
        }
        return registry_ptr;
    }();
    return *r;
}

} // namespace

void *map_shared(int fd, size_t size, off_t offset) {
    Registry &r = registry();
    void *base;
    int err = 0;
    {
        const std::lock_guard hold(r.lock);
        r.live.reserve(r.live.size() + 1); // before mapping: recording it cannot fail after
        base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
        if (base == MAP_FAILED)
            err = errno;
        else
            r.live.push_back({base, size, fd, offset});
    }
    if (base != MAP_FAILED) return base;
    errno = err;
    return nullptr;
}

void unmap_shared(void *base, size_t size) noexcept {
    Registry &r = *registry_ptr; // set by the map_shared that made this mapping
    const std::lock_guard hold(r.lock);
    munmap(base, size);
    std::erase_if(r.live, [base](const Mapping &m) { return m.base == base; });
}

} // namespace zb::shm
