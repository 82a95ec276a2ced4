// Spawning and destroying the worker: resolve where it runs (attributes, then the ZENFLOW_*
// variables the SPANK plugin exported, then the caller's own CPUs), reserve the control segment,
// start zenflow-optimizer with the segment and a socket as fds 3 and 4, and wait, bounded, until
// it has checked the header and pinned its threads.
#include "affinity.hpp"
#include "bitmap.hpp"
#include "error.hpp"
#include "unique_fd.hpp"
#include "wait_deadline.hpp"
#include "worker_handle.hpp"
#include <zbproto/futex.hpp>
#include <zbproto/pidfd.hpp>

#include <zbproto/header.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <numa.h>
#include <sched.h>
#include <spawn.h>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#include <zbutil/decimal.hpp>
#include <zbutil/proc_status.hpp>
#include <zenbind/hwloc.h>

extern char **environ;

namespace {

using zb::fail;
namespace proto = zb::proto;

constexpr unsigned kMaxSpinUs = 50'000;

const char *env_or(const char *given, const char *name) {
    if (given && given[0]) return given;
    const char *v = std::getenv(name);
    return v && v[0] ? v : nullptr;
}

std::vector<int> parse_list(const char *text, const char *what, unsigned max_id) {
    std::unique_ptr<hwloc_bitmap_s, void (*)(hwloc_bitmap_t)> set(hwloc_bitmap_alloc(),
                                                                  hwloc_bitmap_free);
    if (!set) throw std::bad_alloc();
    if (zb_cpulist_parse(text, zb_cpuset_from_hwloc(set.get())) != ZB_OK)
        fail(ZB_EINVAL, std::string(what) + " \"" + text + "\": " + zb_last_error());
    std::vector<int> ids;
    for (int i = hwloc_bitmap_first(set.get()); i >= 0; i = hwloc_bitmap_next(set.get(), i)) {
        if (static_cast<unsigned>(i) > max_id)
            fail(ZB_EINVAL, std::string(what) + " \"" + text + "\": " + std::to_string(i) +
                                " is out of range (at most " + std::to_string(max_id) + ")");
        ids.push_back(i);
    }
    if (ids.empty()) fail(ZB_EINVAL, std::string(what) + " is empty");
    return ids;
}

std::vector<int> resolve_cpus(const zb_worker_attr &a) {
    if (const char *list = env_or(a.cpus, ZB_ENV_OPT_CPUS))
        return parse_list(list, a.cpus && a.cpus[0] ? "attr.cpus" : ZB_ENV_OPT_CPUS,
                          CPU_SETSIZE - 1);
    zb::Bitmap set;
    zb::caller_cpus(set);
    std::vector<int> cpus;
    for (int c = hwloc_bitmap_first(set); c >= 0 && c < CPU_SETSIZE; c = hwloc_bitmap_next(set, c))
        cpus.push_back(c);
    if (cpus.empty())
        fail(ZB_EINVAL, "zb_worker_spawn: no CPU of this process's affinity is below " +
                            std::to_string(CPU_SETSIZE) +
                            "; name the optimizer CPUs in attr.cpus "
                            "or " ZB_ENV_OPT_CPUS);
    return cpus;
}

unsigned resolve_threads(const zb_worker_attr &a, size_t ncpus) {
    if (a.threads) {
        if (a.threads > proto::kMaxThreads)
            fail(ZB_EINVAL, "attr.threads " + std::to_string(a.threads) + " exceeds " +
                                std::to_string(proto::kMaxThreads));
        return a.threads;
    }
    if (const char *t = env_or(nullptr, ZB_ENV_OPT_THREADS)) {
        const auto n = zb::util::parse_decimal(t, proto::kMaxThreads);
        if (!n || *n == 0)
            fail(ZB_EINVAL, std::string(ZB_ENV_OPT_THREADS " \"") + t +
                                "\" is not a thread count from 1 to " +
                                std::to_string(proto::kMaxThreads));
        return static_cast<unsigned>(*n);
    }
    return static_cast<unsigned>(std::min<size_t>(ncpus, proto::kMaxThreads));
}

std::vector<int> resolve_mems(const zb_worker_attr &a, const std::vector<int> &cpus) {
    const int max_node = numa_available() >= 0 ? numa_max_node() : 0;
    if (const char *list = env_or(a.mems, ZB_ENV_OPT_MEMS)) {
        auto nodes = parse_list(list, a.mems && a.mems[0] ? "attr.mems" : ZB_ENV_OPT_MEMS,
                                static_cast<unsigned>(max_node));
        if (nodes.size() > proto::kMaxNodes)
            fail(ZB_EINVAL, "too many NUMA nodes in the mems list");
        return nodes;
    }
    std::vector<int> nodes;
    for (int c : cpus) {
        const int n = numa_available() >= 0 ? numa_node_of_cpu(c) : 0;
        if (n >= 0 && std::find(nodes.begin(), nodes.end(), n) == nodes.end() &&
            nodes.size() < proto::kMaxNodes)
            nodes.push_back(n);
    }
    std::sort(nodes.begin(), nodes.end());
    return nodes;
}

std::string resolve_path(const zb_worker_attr &a) {
    if (const char *p = env_or(a.path, ZB_ENV_OPTIMIZER)) return p;
    return std::string(ZB_LIBEXECDIR) + "/zenflow-optimizer";
}

// The worker's environment: the caller's, with OpenMP told the thread count and not to bind. The
// threads pin themselves with sched_setaffinity: OMP_PLACES would be checked against the affinity
// the worker inherits, which is the trainer's and usually excludes the optimizer CPUs.
std::vector<std::string> worker_environment(unsigned threads) {
    std::vector<std::string> env;
    bool wait_policy = false;
    for (char **e = environ; *e; ++e) {
        const std::string kv = *e;
        // The team is exactly `threads` threads, each pinned by the worker itself.
        if (kv.rfind("OMP_NUM_THREADS=", 0) == 0 || kv.rfind("OMP_PLACES=", 0) == 0 ||
            kv.rfind("OMP_PROC_BIND=", 0) == 0 || kv.rfind("OMP_DYNAMIC=", 0) == 0 ||
            kv.rfind("OMP_THREAD_LIMIT=", 0) == 0)
            continue;
        wait_policy |= kv.rfind("OMP_WAIT_POLICY=", 0) == 0;
        env.push_back(kv);
    }
    env.push_back("OMP_PROC_BIND=false");
    env.push_back("OMP_DYNAMIC=false");
    env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
    // Between steps the team sleeps instead of spinning on cores it may share with training.
    if (!wait_policy) env.push_back("OMP_WAIT_POLICY=passive");
    return env;
}

struct FileActions {
    posix_spawn_file_actions_t fa;
    FileActions() { posix_spawn_file_actions_init(&fa); }
    ~FileActions() { posix_spawn_file_actions_destroy(&fa); }
};

void start(zb_worker &w, const std::string &path, const std::vector<std::string> &env) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        zb::fail_errno("socketpair");
    w.sock = sv[0];
    zb::UniqueFd child_sock{sv[1]};
    // Above 10 so that the dup2s to 3 and 4 in the child cannot clobber each other.
    zb::UniqueFd ctl{fcntl(w.control.fd(), F_DUPFD_CLOEXEC, 10)};
    zb::UniqueFd sock{fcntl(child_sock.fd, F_DUPFD_CLOEXEC, 10)};
    if (ctl.fd < 0 || sock.fd < 0) zb::fail_errno("fcntl(F_DUPFD_CLOEXEC)");
    FileActions fa;
    if (posix_spawn_file_actions_adddup2(&fa.fa, ctl.fd, proto::kControlFd) != 0 ||
        posix_spawn_file_actions_adddup2(&fa.fa, sock.fd, proto::kSocketFd) != 0 ||
        posix_spawn_file_actions_addclosefrom_np(&fa.fa, proto::kSocketFd + 1) != 0)
        throw std::bad_alloc();
    std::vector<char *> envp;
    for (const auto &e : env)
        envp.push_back(const_cast<char *>(e.c_str()));
    envp.push_back(nullptr);
    char *argv[] = {const_cast<char *>(path.c_str()), nullptr};
    pid_t pid = -1;
    // posix_spawn (vfork-like in glibc) rather than fork: a trainer with a huge address space
    // and many threads would pay for copying page tables, and fork in a threaded process is
    // fragile.
    const int err = posix_spawn(&pid, path.c_str(), &fa.fa, nullptr, argv, envp.data());
    if (err != 0)
        fail(err == ENOENT || err == EACCES ? ZB_EINVAL : ZB_ESYS,
             "cannot start the optimizer worker " + path + ": " + std::strerror(err) +
                 " (set ZENFLOW_OPTIMIZER or attr.path)");
    w.pid = pid;
    w.pidfd = proto::pidfd_open(pid);
    if (w.pidfd < 0) {
        const int e = errno;
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        w.reaped = true;
        errno = e;
        zb::fail_errno("pidfd_open of the worker");
    }
}

// Bounded wait for the worker's ready flag; a refused header shows as Exit::version or as the
// worker's own version in the header.
void await_ready(zb_worker &w, const std::string &path) {
    zb::WaitDeadline deadline(int64_t(w.control_timeout_ms) * 1'000'000);
    for (;;) {
        const uint32_t wv = proto::atomic(w.header->worker_version).load(std::memory_order_acquire);
        if (wv != 0 && wv != proto::kVersion)
            fail(ZB_EVERSION, "the optimizer worker " + path + " speaks shared-memory layout " +
                                  std::to_string(wv) + ", this libzenbind speaks " +
                                  std::to_string(proto::kVersion) + ": install matching versions");
        const uint32_t ready = proto::atomic(w.ctl->ready).load(std::memory_order_acquire);
        if (ready == static_cast<uint32_t>(proto::Ready::ready)) return;
        if (ready == static_cast<uint32_t>(proto::Ready::failed)) {
            const char *m = w.ctl->message;
            fail(zb::worker_client::worker_error(w.ctl->status),
                 std::string("optimizer worker could not start: ") +
                     std::string(m, strnlen(m, proto::kMessageSize)));
        }
        try {
            w.check_alive();
        } catch (const zb::Error &e) {
            if (w.exit_code == static_cast<int>(proto::Exit::version))
                fail(ZB_EVERSION, "the optimizer worker " + path +
                                      " refused the shared-memory header (see its message on "
                                      "stderr): install matching versions");
            fail(e.status(),
                 std::string(e.what()) + " while starting (is " + path + " a zenflow-optimizer?)");
        }
        const int64_t left = deadline.left();
        if (left <= 0) fail(ZB_ETIMEDOUT, "the optimizer worker did not start in time");
        deadline.bounded(std::min<int64_t>(left, 20'000'000), [&](int64_t ask) {
            return proto::sleep_for_change(w.ctl->ready, w.ctl->trainer_sleeping, 0, ask);
        });
    }
}

} // namespace

zb_worker::~zb_worker() {
    // In a forked child of the trainer, only this copy of the handle goes; the worker stays.
    if (pid > 0 && !reaped && !forked()) stop("destroyed");
    if (pidfd >= 0) close(pidfd);
    if (sock >= 0) close(sock);
}

namespace {

// Asks the worker to exit (after the step in flight, if any) and collects it, each wait bounded;
// one still there is killed, and one stopped (SIGSTOP, a debugger) at once: it cannot answer, and
// a trainer at exit would otherwise wait control_timeout_ms uninterruptibly (a traced one is then
// collected once its debugger lets it go: the kernel tells the tracer first). The trainer's
// mappings of the shared memory stay.
void end_worker(zb_worker &w, const std::string &why) {
    if (w.reaped) return;
    const char state = zb::util::proc_state(w.pid);
    const bool stopped = state == 'T' || state == 't';
    try {
        if (!stopped) {
            if (w.in_flight) w.wait_response(int64_t(w.control_timeout_ms) * 1'000'000);
            w.ctl->command = proto::Command::exit;
            w.publish_request();
            w.await_exit(int64_t(std::min(w.control_timeout_ms, 10000u)) * 1'000'000);
        }
    } catch (const zb::Error &) {
        // Dead or stuck: stop() kills and reaps it.
    }
    siginfo_t info{};
    if (waitid(P_PIDFD, static_cast<id_t>(w.pidfd), &info, WEXITED | WNOHANG) == 0 &&
        info.si_pid != 0)
        w.reaped = true;
    w.stop(why);
}

} // namespace

extern "C" {

void zb_worker_attr_init_size(zb_worker_attr *attr, size_t size) {
    if (!zb::init_sized(attr, size)) return;
    attr->worker_spin_us = 50;
    attr->wait_spin_us = 50;
    attr->control_timeout_ms = 60000;
}

zb_status zb_worker_spawn(const zb_worker_attr *attr, unsigned long flags, zb_worker_t **out) {
    return zb::guard([&] {
        if (!out) fail(ZB_EINVAL, "zb_worker_spawn: out is NULL");
        *out = nullptr;
        zb::check_flags(flags, 0, "zb_worker_spawn");
        zb_worker_attr a;
        zb_worker_attr_init(&a);
        if (attr) {
            zb::check_size(attr->size, sizeof *attr, "zb_worker_spawn", "attr",
                           "zb_worker_attr_init");
            a = *attr;
            if (!a.control_timeout_ms) a.control_timeout_ms = 60000;
            // The worker checks that its trainer lives only between spins.
            if (a.worker_spin_us > kMaxSpinUs || a.wait_spin_us > kMaxSpinUs)
                fail(ZB_EINVAL,
                     "zb_worker_spawn: worker_spin_us and wait_spin_us must be at most " +
                         std::to_string(kMaxSpinUs) + " (50 ms)");
        }
        const auto cpus = resolve_cpus(a);
        const unsigned threads = resolve_threads(a, cpus.size());
        auto w = std::make_unique<zb_worker>();
        w->owner = getpid();
        w->mems = resolve_mems(a, cpus);
        w->wait_spin_ns = int64_t(a.wait_spin_us) * 1000;
        w->control_timeout_ms = a.control_timeout_ms;
        w->control = zb::shm::Segment("zenflow control block", proto::kControlSegment, w->mems);
        w->header = static_cast<proto::Header *>(w->control.base());
        w->ctl = proto::control_of(w->control.base());
        *w->header = proto::make_header();
        w->ctl->trainer_pid = w->owner;
        w->ctl->nthreads = threads;
        w->nthreads = threads;
        w->ctl->nmems = static_cast<uint32_t>(w->mems.size());
        w->ctl->worker_spin_us = a.worker_spin_us;
        for (unsigned t = 0; t < threads; ++t)
            w->ctl->cpus[t] = cpus[t % cpus.size()];
        std::copy(w->mems.begin(), w->mems.end(), w->ctl->mems);
        const std::string path = resolve_path(a);
        start(*w, path, worker_environment(threads));
        await_ready(*w, path);
        *out = w.release();
    });
}

zb_status zb_worker_stop(zb_worker_t *w) {
    return zb::guard([&] {
        if (!w) fail(ZB_EINVAL, "zb_worker_stop: worker is NULL");
        if (w->forked())
            fail(ZB_EINVAL, "zb_worker_stop: this worker belongs to process " +
                                std::to_string(w->owner) + "; a forked child cannot stop it");
        end_worker(*w, "the optimizer worker (pid " + std::to_string(w->pid) +
                           ") was stopped by zb_worker_stop()");
    });
}

zb_status zb_worker_destroy(zb_worker_t *w) {
    return zb::guard([&] {
        if (!w) return;
        std::unique_ptr<zb_worker> owned(w);
        if (!w->forked()) end_worker(*w, "destroyed"); // a forked child only forgets its copy
    });
}
}
