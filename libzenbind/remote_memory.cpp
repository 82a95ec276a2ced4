#include "remote_memory.hpp"

#include "error.hpp"

#include <algorithm>
#include <cerrno>
#include <string>
#include <sys/uio.h>

namespace zb::remote {

namespace {

// The source of zeros: read many times, never written (.bss, so it costs nothing until read).
constexpr size_t kZeros = size_t(256) << 10;
alignas(64) char zeros[kZeros];

// At most this many iovecs per call (IOV_MAX is 1024 on Linux).
constexpr size_t kBatch = 1024;

bool refused(int err) {
    return err == EPERM || err == EACCES || err == ENOSYS;
}

} // namespace

bool write(pid_t pid, const std::vector<Piece> &pieces) {
    // Pieces cut to iovecs: zeros in kZeros blocks, the same block read again for each.
    std::vector<iovec> local, remote;
    for (const Piece &p : pieces)
        for (size_t at = 0; at < p.bytes;) {
            const size_t n = p.from ? p.bytes - at : std::min(kZeros, p.bytes - at);
            const void *src = p.from ? static_cast<const char *>(p.from) + at : zeros;
            local.push_back(iovec{const_cast<void *>(src), n});
            remote.push_back(iovec{reinterpret_cast<void *>(p.to + at), n});
            at += n;
        }
    bool first = true;
    for (size_t i = 0; i < local.size();) {
        const size_t count = std::min(kBatch, local.size() - i);
        size_t want = 0;
        for (size_t k = i; k < i + count; ++k)
            want += local[k].iov_len;
        const ssize_t got = process_vm_writev(pid, &local[i], count, &remote[i], count, 0);
        if (got < 0 && first && refused(errno)) return false;
        if (got <= 0) {
            const int err = got < 0 ? errno : EFAULT;
            if (err == ESRCH) fail(ZB_EDEAD, "the optimizer worker is gone");
            if (err == EFAULT)
                fail(ZB_EINVAL, "the optimizer state to load is not readable memory of this "
                                "process");
            errno = err;
            fail_errno("writing the optimizer state into the worker (process_vm_writev)");
        }
        first = false;
        if (size_t(got) == want) {
            i += count;
            continue;
        }
        // A partial write: what is left of the batch goes again.
        for (size_t done = size_t(got); done > 0;) {
            const size_t n = std::min(done, local[i].iov_len);
            local[i].iov_base = static_cast<char *>(local[i].iov_base) + n;
            remote[i].iov_base = static_cast<char *>(remote[i].iov_base) + n;
            local[i].iov_len -= n;
            remote[i].iov_len -= n;
            done -= n;
            if (local[i].iov_len == 0) ++i;
        }
    }
    return true;
}

} // namespace zb::remote
