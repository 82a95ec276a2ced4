// Where a parameter group's buffers lie in its range of the groups' memfd: computed once by the
// trainer (lay_out_group), checked once by the worker against the memfd it received (group_fits),
// because the worker writes through every offset and takes nothing on trust.
#pragma once

#include "layout.hpp"

#include <cstdint>

namespace zb::proto {

// The descriptor of a group of `numel` parameters (hyperparameters left zero): params first, then
// the gradient buffers (2, or 1: off_grads[1] 0), copy-out and stale when present, each starting on
// a page so that the kernels see aligned vectors; segment_size covers them all. numel is at most
// 2^40 (the caller's check), so no size overflows.
GroupDesc lay_out_group(uint64_t numel, Dtype grad, Dtype copy, bool stale,
                        unsigned grad_buffers = 2);

// Why `d` does not describe a range of a memfd of file_size bytes, or nullptr if it does: known
// dtypes, the range [segment_offset, segment_offset + segment_size) page-aligned and inside the
// file, every present buffer inside the range, 64-byte aligned, and no two buffers overlapping;
// absent buffers have offset 0.
const char *group_fits(const GroupDesc &d, uint64_t file_size);

// A transfer segment carries one group's Adam moments between the trainer and the worker (they
// live only in the worker): exp_avg at offset 0, exp_avg_sq at exp_avg_sq, numel floats each.
struct TransferLayout {
    uint64_t exp_avg_sq;
    uint64_t size;
};
TransferLayout transfer_layout(uint64_t numel);

} // namespace zb::proto
