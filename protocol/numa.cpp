#include "zbproto/numa.hpp"

#include <cerrno>
#include <numaif.h>

namespace zb::proto {
namespace {

constexpr unsigned long kMaskBits = 1024, kWord = 8 * sizeof(unsigned long);

// mbind(2) with a mask of kMaskBits nodes. The kernel reads maxnode - 1 bits of the mask
// (get_nodes() in mm/mempolicy.c, as libnuma knows): without the + 1, node 1023 would be dropped
// and MPOL_PREFERRED left with no node means local allocation.
bool bind(void *addr, size_t len, int mode, const unsigned long *mask) {
    return mbind(addr, len, mode, mask, kMaskBits + 1, 0) == 0;
}

} // namespace

bool prefer_nodes(void *addr, size_t len, const int32_t *nodes, size_t count) {
    unsigned long all[kMaskBits / kWord] = {};
    size_t valid = 0;
    for (size_t i = 0; i < count; ++i) {
        const int32_t n = nodes[i];
        if (n < 0 || static_cast<unsigned long>(n) >= kMaskBits) continue;
        all[n / kWord] |= 1UL << (n % kWord);
        ++valid;
    }
    if (!valid) return false;
    if (valid > 1 && bind(addr, len, MPOL_PREFERRED_MANY, all)) return true;
    // One node, or a kernel without MPOL_PREFERRED_MANY: the first listed node the kernel takes.
    // It refuses (EINVAL) a node without memory or outside the cgroup's cpuset.mems, where a
    // later node of the list may still be fine.
    for (size_t i = 0; i < count; ++i) {
        const int32_t n = nodes[i];
        if (n < 0 || static_cast<unsigned long>(n) >= kMaskBits) continue;
        unsigned long one[kMaskBits / kWord] = {};
        one[n / kWord] |= 1UL << (n % kWord);
        if (bind(addr, len, MPOL_PREFERRED, one)) return true;
        if (errno != EINVAL) return false; // no NUMA support, a seccomp filter: no node will do
    }
    return false;
}

} // namespace zb::proto
