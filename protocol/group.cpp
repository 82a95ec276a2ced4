#include "zbproto/group.hpp"

namespace zb::proto {
namespace {

struct Range {
    uint64_t off, bytes;
};

// [off, off + bytes) lies inside `size` bytes and starts on a vector's width.
bool inside(Range r, uint64_t size) {
    return r.off % 64 == 0 && r.off <= size && r.bytes <= size - r.off;
}

bool overlap(Range a, Range b) {
    return a.off < b.off + b.bytes && b.off < a.off + a.bytes;
}

} // namespace

GroupDesc lay_out_group(uint64_t numel, Dtype grad, Dtype copy, bool stale, unsigned grad_buffers) {
    GroupDesc d{};
    d.numel = numel;
    d.grad = grad;
    d.copy = copy;
    d.stale = stale ? 1 : 0;
    uint64_t off = page_round(4 * numel);
    for (unsigned k = 0; k < (grad_buffers == 1 ? 1u : 2u); ++k) {
        d.off_grads[k] = off;
        off += page_round(dtype_size(grad) * numel);
    }
    if (copy != Dtype::none) {
        d.off_copy = off;
        off += page_round(dtype_size(copy) * numel);
    }
    if (stale) {
        d.off_stale = off;
        off += page_round(4 * numel);
    }
    d.segment_size = off;
    return d;
}

const char *group_fits(const GroupDesc &d, uint64_t file_size) {
    const uint64_t n = d.numel, size = d.segment_size;
    if (d.grad != Dtype::f32 && d.grad != Dtype::bf16 && d.grad != Dtype::f16)
        return "unknown gradient type";
    if (d.copy != Dtype::none && d.copy != Dtype::bf16 && d.copy != Dtype::f16)
        return "unknown copy-out type";
    if (d.stale > 1) return "stale is neither 0 nor 1";
    if (d.segment_offset % kPage != 0 || d.segment_offset > file_size ||
        size > file_size - d.segment_offset)
        return "the group's range is misaligned or outside its shared memory";
    // Every buffer holds at least 2 bytes per element, so this bounds every product below.
    if (n == 0 || n > size / 4) return "numel does not fit the segment";
    Range r[5];
    unsigned count = 0;
    r[count++] = {d.off_params, 4 * n};
    r[count++] = {d.off_grads[0], dtype_size(d.grad) * n};
    if (d.off_grads[1] != 0) r[count++] = {d.off_grads[1], dtype_size(d.grad) * n};
    if (d.copy != Dtype::none)
        r[count++] = {d.off_copy, dtype_size(d.copy) * n};
    else if (d.off_copy != 0)
        return "an absent copy-out has an offset";
    if (d.stale)
        r[count++] = {d.off_stale, 4 * n};
    else if (d.off_stale != 0)
        return "an absent stale buffer has an offset";
    for (unsigned i = 0; i < count; ++i) {
        if (!inside(r[i], size)) return "a buffer is misaligned or outside the segment";
        for (unsigned j = 0; j < i; ++j)
            if (overlap(r[i], r[j])) return "two buffers overlap";
    }
    return nullptr;
}

TransferLayout transfer_layout(uint64_t numel) {
    const uint64_t half = page_round(4 * numel);
    return TransferLayout{half, 2 * half};
}

} // namespace zb::proto
