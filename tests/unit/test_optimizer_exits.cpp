// zenflow-optimizer(1), EXIT STATUS, run by hand against a control block this test writes: 0 for
// --version and when told to exit, 2 for other arguments, 78 without a control block, 1 for a bad
// thread count (the reason in the control block). 78 for another layout and 0 when the trainer
// dies are in test_worker.c.
#include <zbproto/futex.hpp>
#include <zbproto/header.hpp>
#include <zbproto/layout.hpp>

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include <cmocka.h>
}

namespace proto = zb::proto;

namespace {

struct Ran {
    int status = -1; // exit status, or -1 if it did not exit
    std::string out; // standard output and error
};

struct Started {
    pid_t pid;
    int out; // read end of its standard output and error
    int sock;
};

// Starts zenflow-optimizer with `args`; control >= 0 becomes fd 3 and a socket fd 4.
Started start(std::initializer_list<const char *> args, int control) {
    const char *exe = std::getenv("ZENFLOW_OPTIMIZER");
    assert_non_null(exe);
    int out[2], sock[2];
    assert_int_equal(pipe(out), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sock), 0);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        if (control >= 0) {
            dup2(control, proto::kControlFd);
            dup2(sock[1], proto::kSocketFd);
        } else {
            close(proto::kControlFd);
            close(proto::kSocketFd);
        }
        std::vector<char *> argv{const_cast<char *>(exe)};
        for (const char *a : args)
            argv.push_back(const_cast<char *>(a));
        argv.push_back(nullptr);
        alarm(20); // survives exec: a worker that does not exit is killed, and the test fails
        execv(exe, argv.data());
        _exit(127);
    }
    close(out[1]);
    close(sock[1]);
    return {child, out[0], sock[0]};
}

// Collects its output until it exits.
Ran finish(const Started &s) {
    Ran r;
    char buf[512];
    ssize_t n;
    while ((n = read(s.out, buf, sizeof buf)) > 0)
        r.out.append(buf, static_cast<size_t>(n));
    close(s.out);
    int status = 0;
    assert_int_equal(waitpid(s.pid, &status, 0), s.pid);
    close(s.sock);
    if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
    return r;
}

Ran run(std::initializer_list<const char *> args, int control) {
    return finish(start(args, control));
}

// A control block of this layout, mapped, for `threads` threads and this process as the trainer.
struct ControlBlock {
    int fd;
    void *base;
    proto::Control *ctl;

    explicit ControlBlock(uint32_t threads) {
        fd = memfd_create("control", MFD_ALLOW_SEALING);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, proto::kControlSegment), 0);
        // as libzenbind seals it: the worker refuses a control block that could shrink
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
        base = mmap(nullptr, proto::kControlSegment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(base != MAP_FAILED);
        *static_cast<proto::Header *>(base) = proto::make_header();
        ctl = proto::control_of(base);
        ctl->trainer_pid = getpid();
        ctl->nthreads = threads;
    }
    ~ControlBlock() {
        munmap(base, proto::kControlSegment);
        close(fd);
    }
};

void version_and_usage(void **) {
    Ran r = run({"--version"}, -1);
    assert_int_equal(r.status, 0);
    const std::string layout = "(shared-memory layout " + std::to_string(proto::kVersion) + ")";
    assert_true(r.out.rfind("zenflow-optimizer ", 0) == 0);
    assert_true(r.out.find(layout) != std::string::npos);
    r = run({"--bogus"}, -1);
    assert_int_equal(r.status, 2);
    assert_true(r.out.find("usage: zenflow-optimizer [--version]") != std::string::npos);
}

void no_control_block(void **) {
    const Ran r = run({}, -1);
    assert_int_equal(r.status, 78);
    assert_true(r.out.find("fd 3 is not a control block") != std::string::npos);
}

// A control block of this layout whose thread count the worker cannot run.
void bad_thread_count(void **) {
    for (uint32_t threads : {0u, static_cast<uint32_t>(proto::kMaxThreads) + 1}) {
        ControlBlock cb(threads);
        const Ran r = run({}, cb.fd);
        assert_int_equal(r.status, 1);
        assert_int_equal(cb.ctl->ready, static_cast<uint32_t>(proto::Ready::failed));
        const std::string want = "bad thread count " + std::to_string(threads);
        assert_string_equal(cb.ctl->message, want.c_str());
    }
}

// A worker that started its team and is told to exit exits 0.
void told_to_exit(void **) {
    ControlBlock cb(1);
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mine)) {
            cb.ctl->cpus[0] = c;
            break;
        }
    const Started s = start({}, cb.fd);
    uint32_t ready = 0;
    for (int i = 0; i < 100 && !ready; ++i) // up to 10 s
        ready = proto::sleep_for_change(cb.ctl->ready, cb.ctl->trainer_sleeping, 0, 100'000'000);
    assert_int_equal(ready, static_cast<uint32_t>(proto::Ready::ready));
    cb.ctl->command = proto::Command::exit;
    proto::publish(cb.ctl->req_seq, cb.ctl->worker_sleeping, 1);
    const Ran r = finish(s);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out.c_str(), "");
}

} // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(version_and_usage),
        cmocka_unit_test(no_control_block),
        cmocka_unit_test(bad_thread_count),
        cmocka_unit_test(told_to_exit),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
