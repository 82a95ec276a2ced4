// The one NUMA placement policy of shared buffers and Adam moments: preferred, not bound, because
// a full node must spill to another instead of turning into an out-of-memory kill.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zb::proto {

// Prefers `nodes` for the pages of [addr, addr + len) not yet allocated. Several nodes need
// MPOL_PREFERRED_MANY (Linux 5.15); older kernels get the first node. Placement is an
// optimisation, never a reason to fail: where the kernel refuses (no NUMA support, a seccomp
// filter, a node outside the mask), the pages keep the default policy and this returns false.
bool prefer_nodes(void *addr, size_t len, const int32_t *nodes, size_t count);

} // namespace zb::proto
