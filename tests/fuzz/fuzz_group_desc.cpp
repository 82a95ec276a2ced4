// zb::proto::group_fits on arbitrary descriptors: the worker writes through every offset of a
// group descriptor the trainer wrote, so whatever it accepts must lie inside the group's range of
// the memfd, the range inside the memfd, aligned, without two buffers sharing a byte, and sized as
// the dtypes say.
#include "check.hpp"

#include <zbproto/group.hpp>

#include <cstdint>
#include <cstring>

namespace {

using namespace zb::proto;

struct Span {
    uint64_t off, bytes;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    GroupDesc d{};
    uint64_t segment = 0;
    if (size < sizeof d + sizeof segment) return 0;
    std::memcpy(&d, data, sizeof d);
    std::memcpy(&segment, data + sizeof d, sizeof segment);
    if (group_fits(d, segment) != nullptr) return 0;

    const uint64_t n = d.numel;
    const uint64_t g = dtype_size(d.grad);
    ZB_FUZZ_CHECK(d.segment_offset % kPage == 0 && d.segment_offset <= segment &&
                  d.segment_size <= segment - d.segment_offset);
    ZB_FUZZ_CHECK(n > 0 && (g == 2 || g == 4));
    ZB_FUZZ_CHECK(d.copy == Dtype::none || dtype_size(d.copy) == 2);
    const uint64_t range = d.segment_size;
    // No size below can wrap: the params alone (4 bytes each) fit in the range.
    ZB_FUZZ_CHECK(n <= range / 4);
    Span spans[5];
    int count = 0;
    spans[count++] = {d.off_params, 4 * n};
    spans[count++] = {d.off_grads[0], g * n};
    if (d.off_grads[1] != 0) spans[count++] = {d.off_grads[1], g * n}; // else one buffer
    if (d.copy != Dtype::none)
        spans[count++] = {d.off_copy, 2 * n};
    else
        ZB_FUZZ_CHECK(d.off_copy == 0);
    if (d.stale)
        spans[count++] = {d.off_stale, 4 * n};
    else
        ZB_FUZZ_CHECK(d.off_stale == 0);
    for (int i = 0; i < count; ++i) {
        ZB_FUZZ_CHECK(spans[i].off % 64 == 0);
        ZB_FUZZ_CHECK(spans[i].off <= range && spans[i].bytes <= range - spans[i].off);
        for (int j = 0; j < i; ++j)
            ZB_FUZZ_CHECK(spans[i].off + spans[i].bytes <= spans[j].off ||
                          spans[j].off + spans[j].bytes <= spans[i].off);
    }
    // What the trainer lays out always fits.
    const GroupDesc laid =
        lay_out_group(n % 4096 + 1, d.grad == Dtype::f32 ? Dtype::f32 : Dtype::bf16, d.copy,
                      d.stale != 0, d.off_grads[1] != 0 ? 2 : 1);
    ZB_FUZZ_CHECK(group_fits(laid, laid.segment_size) == nullptr);
    return 0;
}
