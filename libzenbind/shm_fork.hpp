// Shared mappings that a fork() does not share. The worker's segments are mapped MAP_SHARED, and a
// forked child (a data-loader process, a user's multiprocessing fork) would inherit them shared:
// its writes would land in the trainer's parameters, gradients and control block. Every mapping
// made here is recorded, and a pthread_atfork child handler maps each one again at the same
// address, MAP_PRIVATE from the same memfd: the child reads what is there without copying
// anything, and the pages it writes become its own. The parent pays one uncontended lock per fork.
#pragma once

#include <cstddef>
#include <sys/types.h>

namespace zb::shm {

// mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset), recorded for the fork
// handler (which needs fd open while the mapping lives); nullptr with errno set on failure. Throws
// std::bad_alloc if it cannot be recorded.
void *map_shared(int fd, size_t size, off_t offset = 0);
// munmap of a mapping from map_shared, and forgets it.
void unmap_shared(void *base, size_t size) noexcept;

} // namespace zb::shm
