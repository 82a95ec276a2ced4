#include "remote_memory.hpp"

#include "error.hpp"
#include "omp_team.hpp"

#include <algorithm>
#include <cerrno>
#include <string>
#include <sys/uio.h>

#include <omp.h>

namespace zb::remote {

namespace {

// The source of zeros: read many times, never written (.bss, so it costs nothing until read).
constexpr size_t kZeros = size_t(256) << 10;
alignas(64) char zeros[kZeros];

// Pieces go in iovecs of at most kChunk bytes, so that threads can share them out; a call takes
// at most kBatch of them (IOV_MAX is 1024 on Linux).
constexpr size_t kChunk = size_t(4) << 20, kBatch = 1024;

using Call = ssize_t (*)(pid_t, const iovec *, unsigned long, const iovec *, unsigned long,
                         unsigned long);

struct Outcome {
    int err = 0;          // errno of the call that failed
    bool refused = false; // the first call of this thread was refused
};

// Copies iovecs [i, end) with `call`, in batches, going on after a partial copy.
Outcome copy(pid_t pid, Call call, iovec *local, iovec *remote, size_t i, size_t end) {
    bool first = true;
    while (i < end) {
        const size_t count = std::min(kBatch, end - i);
        size_t want = 0;
        for (size_t k = i; k < i + count; ++k)
            want += local[k].iov_len;
        const ssize_t got = call(pid, &local[i], count, &remote[i], count, 0);
        if (got <= 0) {
            const int err = got < 0 ? errno : EFAULT;
            return Outcome{err, first && (err == EPERM || err == EACCES || err == ENOSYS)};
        }
        first = false;
        if (size_t(got) == want) {
            i += count;
            continue;
        }
        for (size_t done = size_t(got); done > 0;) { // what is left of the batch goes again
            const size_t n = std::min(done, local[i].iov_len);
            local[i].iov_base = static_cast<char *>(local[i].iov_base) + n;
            remote[i].iov_base = static_cast<char *>(remote[i].iov_base) + n;
            local[i].iov_len -= n;
            remote[i].iov_len -= n;
            done -= n;
            if (local[i].iov_len == 0) ++i;
        }
    }
    return Outcome{};
}

bool transfer(pid_t pid, const std::vector<Piece> &pieces, bool out) {
    std::vector<iovec> local, remote;
    size_t total = 0;
    for (const Piece &p : pieces) {
        if (!out && !p.local) fail(ZB_EINTERNAL, "a read of the worker's memory into nothing");
        const size_t chunk = p.local ? kChunk : kZeros; // zeros: the same block read again
        for (size_t at = 0; at < p.bytes;) {
            const size_t n = std::min(chunk, p.bytes - at);
            void *mine = p.local ? static_cast<char *>(p.local) + at : zeros;
            local.push_back(iovec{mine, n});
            remote.push_back(iovec{reinterpret_cast<void *>(p.remote + at), n});
            at += n;
        }
        total += p.bytes;
    }
    const Call call = out ? process_vm_writev : process_vm_readv;
    const size_t threads = static_cast<size_t>(zb::team_threads(
        static_cast<int>(std::max<size_t>(1, std::min(copy_threads(total), local.size())))));
    std::vector<Outcome> outcome(threads);
#pragma omp parallel for num_threads(static_cast <int>(threads)) schedule(static, 1)
    for (size_t t = 0; t < threads; ++t)
        outcome[t] = copy(pid, call, local.data(), remote.data(), local.size() * t / threads,
                          local.size() * (t + 1) / threads);
    for (const Outcome &o : outcome)
        if (o.refused) return false;
    for (const Outcome &o : outcome) {
        if (!o.err) continue;
        if (o.err == ESRCH) fail(ZB_EDEAD, "the optimizer worker is gone");
        if (o.err == EFAULT)
            fail(ZB_EINVAL, out ? "the optimizer state to load is not readable memory (or the "
                                  "worker's moments are not where it said)"
                                : "the memory for the optimizer state is not writable (or the "
                                  "worker's moments are not where it said)");
        errno = o.err;
        fail_errno(out ? "writing the optimizer state into the worker (process_vm_writev)"
                       : "reading the optimizer state from the worker (process_vm_readv)");
    }
    return true;
}

} // namespace

size_t copy_threads(size_t bytes) {
    constexpr size_t kPerThread = size_t(16) << 20;
    return std::min(size_t(omp_get_max_threads()), bytes / kPerThread + 1);
}

bool write(pid_t pid, const std::vector<Piece> &pieces) {
    return transfer(pid, pieces, true);
}

bool read(pid_t pid, const std::vector<Piece> &pieces) {
    return transfer(pid, pieces, false);
}

} // namespace zb::remote
