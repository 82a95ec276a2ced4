// The worker protocol without a worker: every group layout is accepted by the validator the worker
// runs, and descriptors a trainer could corrupt (misaligned, overlapping, out of range, sizes that
// overflow) are refused; the header check; fd passing over a socket pair.
#include <zbproto/fd_passing.hpp>
#include <zbproto/group.hpp>
#include <zbproto/header.hpp>
#include <zbproto/layout.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

namespace proto = zb::proto;
using proto::Dtype;

const Dtype kGrads[] = {Dtype::f32, Dtype::bf16, Dtype::f16};
const Dtype kCopies[] = {Dtype::none, Dtype::bf16, Dtype::f16};
const uint64_t kSizes[] = {1, 15, 16, 1024, 1025, 1000003, uint64_t(1) << 40};

struct Buf {
    uint64_t off, bytes;
};

void test_every_layout_fits(void **) {
    for (Dtype grad : kGrads)
        for (Dtype copy : kCopies)
            for (int stale = 0; stale < 2; ++stale)
                for (unsigned buffers = 1; buffers <= 2; ++buffers)
                    for (uint64_t n : kSizes) {
                        const proto::GroupDesc d =
                            proto::lay_out_group(n, grad, copy, stale, buffers);
                        assert_null(proto::group_fits(d, d.segment_size));
                        assert_int_equal(d.numel, n);
                        Buf b[5] = {
                            {d.off_params, 4 * n},
                            {d.off_grads[0], proto::dtype_size(grad) * n},
                            {d.off_grads[1], buffers == 2 ? proto::dtype_size(grad) * n : 0},
                            {d.off_copy, proto::dtype_size(copy) * n},
                            {d.off_stale, stale ? 4 * n : 0}};
                        uint64_t total = 0;
                        for (const Buf &x : b) {
                            if (x.bytes == 0) {
                                assert_int_equal(x.off, 0); // absent
                                continue;
                            }
                            assert_int_equal(x.off % proto::kPage, 0);
                            assert_true(x.off + x.bytes <= d.segment_size);
                            total += proto::page_round(x.bytes);
                        }
                        // Packed: nothing but page rounding between the buffers.
                        assert_int_equal(d.segment_size, total);
                        const proto::TransferLayout t = proto::transfer_layout(n);
                        assert_true(t.exp_avg_sq >= 4 * n && t.exp_avg_sq % proto::kPage == 0);
                        assert_int_equal(t.size, t.exp_avg_sq + proto::page_round(4 * n));
                        // The range lies inside the memfd, page-aligned, anywhere in it.
                        assert_null(proto::group_fits(d, d.segment_size + proto::kPage));
                        assert_non_null(proto::group_fits(d, d.segment_size - 1));
                        proto::GroupDesc at = d;
                        at.segment_offset = proto::kPage;
                        assert_null(proto::group_fits(at, d.segment_size + proto::kPage));
                        assert_non_null(proto::group_fits(at, d.segment_size + proto::kPage - 1));
                        at.segment_offset = 64;
                        assert_non_null(proto::group_fits(at, d.segment_size + proto::kPage));
                        at.segment_offset = UINT64_MAX - proto::kPage + 1; // the end wraps
                        assert_non_null(proto::group_fits(at, UINT64_MAX));
                    }
}

// Each corruption of a valid descriptor, applied alone, is refused with a reason.
void test_rejected_descriptors(void **) {
    for (Dtype grad : kGrads)
        for (Dtype copy : kCopies)
            for (int stale = 0; stale < 2; ++stale) {
                const uint64_t n = 1000;
                const proto::GroupDesc good = proto::lay_out_group(n, grad, copy, stale);
                auto refused = [&](auto change, const char *why) {
                    proto::GroupDesc d = good;
                    change(d);
                    if (!proto::group_fits(d, d.segment_size))
                        fail_msg("accepted a descriptor with %s", why);
                };
                refused([](proto::GroupDesc &d) { d.off_grads[0] += 8; }, "a misaligned grad");
                refused([](proto::GroupDesc &d) { d.off_params = 32; }, "misaligned params");
                refused([](proto::GroupDesc &d) { d.off_grads[1] = d.off_grads[0]; },
                        "both gradient buffers at one offset");
                refused([](proto::GroupDesc &d) { d.off_grads[0] = d.off_params + 64; },
                        "a grad overlapping params");
                refused([](proto::GroupDesc &d) { d.off_grads[1] = d.segment_size; },
                        "a grad past the end");
                refused([](proto::GroupDesc &d) { d.off_grads[1] = UINT64_MAX - 63; },
                        "an offset that wraps");
                refused([](proto::GroupDesc &d) { d.numel = d.segment_size; },
                        "more elements than the segment holds");
                refused([](proto::GroupDesc &d) { d.numel = uint64_t(1) << 62; },
                        "a size that overflows");
                refused([](proto::GroupDesc &d) { d.numel = 0; }, "no element");
                refused([](proto::GroupDesc &d) { d.grad = Dtype::none; }, "no gradient type");
                refused([](proto::GroupDesc &d) { d.grad = static_cast<Dtype>(9); },
                        "an unknown gradient type");
                refused([](proto::GroupDesc &d) { d.copy = Dtype::f32; }, "an fp32 copy-out");
                refused([](proto::GroupDesc &d) { d.stale = 2; }, "stale 2");
                if (copy == Dtype::none)
                    refused([](proto::GroupDesc &d) { d.off_copy = d.off_grads[1]; },
                            "an absent copy-out with an offset");
                else
                    refused([](proto::GroupDesc &d) { d.off_copy = d.off_grads[1]; },
                            "a copy-out over a grad");
                if (stale)
                    refused([](proto::GroupDesc &d) { d.off_stale = 0; }, "stale over params");
                else
                    refused([](proto::GroupDesc &d) { d.off_stale = d.off_grads[0]; },
                            "an absent stale buffer with an offset");
            }
}

void test_header(void **) {
    static char block[proto::kControlSegment];
    auto &h = *reinterpret_cast<proto::Header *>(block);
    h = proto::make_header();
    assert_string_equal(proto::accept_header(h, sizeof block).c_str(), "");
    assert_int_equal(h.worker_version, proto::kVersion);
    assert_true(proto::accept_header(h, sizeof block - 1).find("sizes differ") !=
                std::string::npos);
    h.version = 999;
    h.worker_version = 0;
    assert_true(proto::accept_header(h, sizeof block).find("layout 999") != std::string::npos);
    assert_int_equal(h.worker_version, proto::kVersion); // announced even when refusing
    h = proto::make_header();
    h.control_size += 64;
    assert_true(proto::accept_header(h, sizeof block).find("sizes differ") != std::string::npos);
    h = proto::make_header();
    h.magic ^= 1;
    assert_true(proto::accept_header(h, sizeof block).find("bad magic") != std::string::npos);
    // The trainer recognises a refusal by this code, and zenflow-optimizer(1) documents it.
    assert_int_equal(static_cast<int>(proto::Exit::version), 78);
}

void test_fd_passing(void **) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    uint32_t tag = 0;
    assert_int_equal(proto::receive_fd(sv[1], tag), -1);
    assert_int_equal(errno, EAGAIN);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    assert_int_equal(proto::send_fd(sv[0], pipefd[1], 7), 0);
    const int got = proto::receive_fd(sv[1], tag);
    assert_true(got >= 0);
    assert_int_equal(tag, 7);
    assert_int_equal(write(got, "x", 1), 1); // the same pipe, through another descriptor
    char c = 0;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    assert_int_equal(c, 'x');
    // A message without an fd is refused, not mistaken for one.
    const uint32_t bare = 3;
    assert_int_equal(send(sv[0], &bare, sizeof bare, 0), sizeof bare);
    assert_int_equal(proto::receive_fd(sv[1], tag), -1);
    assert_int_equal(errno, EPROTO);
    close(got);
    close(pipefd[0]);
    close(pipefd[1]);
    close(sv[0]);
    close(sv[1]);
}

} // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_every_layout_fits),
        cmocka_unit_test(test_rejected_descriptors),
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_fd_passing),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
