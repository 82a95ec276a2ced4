#include "zbproto/numa.hpp"

#include <numaif.h>

namespace zb::proto {

bool prefer_nodes(void *addr, size_t len, const int32_t *nodes, size_t count) {
    constexpr unsigned long kMaskBits = 1024, kWord = 8 * sizeof(unsigned long);
    unsigned long all[kMaskBits / kWord] = {}, first[kMaskBits / kWord] = {};
    int32_t head = -1;
    for (size_t i = 0; i < count; ++i) {
        const int32_t n = nodes[i];
        if (n < 0 || static_cast<unsigned long>(n) >= kMaskBits) continue;
        if (head < 0) head = n;
        all[n / kWord] |= 1UL << (n % kWord);
    }
    if (head < 0) return false;
    if (count > 1 && mbind(addr, len, MPOL_PREFERRED_MANY, all, kMaskBits, 0) == 0) return true;
    first[head / kWord] |= 1UL << (head % kWord);
    return mbind(addr, len, MPOL_PREFERRED, first, kMaskBits, 0) == 0;
}

} // namespace zb::proto
