// zenflow-optimizer against a trainer that breaks the protocol: this test writes the control block
// and sends the fds itself, as a buggy trainer (not libzenbind) could. The worker must refuse what
// it cannot use safely, never die of a signal, and never outlive its trainer for long.
#include <zbproto/fd_passing.hpp>
#include <zbproto/futex.hpp>
#include <zbproto/group.hpp>
#include <zbproto/header.hpp>
#include <zbproto/layout.hpp>
#include <zbproto/pidfd.hpp>
#include <zenbind/zenbind.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include <cmocka.h>
}

namespace proto = zb::proto;

namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// A memfd of `size` bytes, with `seals` added (0: none: it can still shrink).
int memfd(size_t size, unsigned seals) {
    const int fd = memfd_create("hostile", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, static_cast<off_t>(size)), 0);
    if (seals) assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
}

int first_cpu() {
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mine)) return c;
    fail_msg("no CPU");
    return -1;
}

// This process as a trainer of one worker of one thread, speaking the protocol by hand.
struct Trainer {
    int control = -1;
    proto::Control *ctl = nullptr;
    void *base = nullptr;
    int sock = -1;
    pid_t pid = -1;
    uint32_t seq = 0;

    // The control block, `control_seals` added to its memfd; `spin_us` the worker's spin.
    explicit Trainer(unsigned control_seals = kSeals, uint32_t spin_us = 50) {
        control = memfd(proto::kControlSegment, 0);
        base =
            mmap(nullptr, proto::kControlSegment, PROT_READ | PROT_WRITE, MAP_SHARED, control, 0);
        assert_true(base != MAP_FAILED);
        if (control_seals) assert_int_equal(fcntl(control, F_ADD_SEALS, control_seals), 0);
        *static_cast<proto::Header *>(base) = proto::make_header();
        ctl = proto::control_of(base);
        ctl->trainer_pid = getpid();
        ctl->nthreads = 1;
        ctl->worker_spin_us = spin_us;
        ctl->cpus[0] = first_cpu();
    }
    ~Trainer() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (sock >= 0) close(sock);
        munmap(base, proto::kControlSegment);
        close(control);
    }

    // Starts the worker as this process's child.
    void start() {
        const char *exe = std::getenv("ZENFLOW_OPTIMIZER");
        assert_non_null(exe);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            dup2(control, proto::kControlFd);
            dup2(sv[1], proto::kSocketFd);
            alarm(60); // survives exec: a worker that does not exit is killed
            execl(exe, exe, static_cast<char *>(nullptr));
            _exit(127);
        }
        close(sv[1]);
        sock = sv[0];
    }

    // Exit status of the worker if it exits within `ms`, else -1.
    int exited_within(int ms) {
        for (int i = 0; i < ms / 10; ++i) {
            int status = 0;
            if (waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            usleep(10'000);
        }
        return -1;
    }

    void await_ready() {
        uint32_t ready = 0;
        for (int i = 0; i < 100 && !ready; ++i) // up to 10 s
            ready = proto::sleep_for_change(ctl->ready, ctl->trainer_sleeping, 0, 100'000'000);
        assert_int_equal(ready, static_cast<uint32_t>(proto::Ready::ready));
    }

    void publish(proto::Command command) {
        ctl->command = command;
        proto::publish(ctl->req_seq, ctl->worker_sleeping, ++seq);
    }

    // The answer to the last request (within 20 s): its status.
    int answer() {
        uint32_t done = proto::atomic(ctl->done_seq).load();
        for (int i = 0; i < 200 && done != seq; ++i)
            done = proto::sleep_for_change(ctl->done_seq, ctl->trainer_sleeping, done, 100'000'000);
        assert_int_equal(done, seq);
        return ctl->status;
    }

    int run(proto::Command command) {
        publish(command);
        return answer();
    }

    // Registers group `index` of `numel` fp32 parameters in a memfd given `seals`: the status.
    int add_group(uint32_t index, uint64_t numel, unsigned seals) {
        proto::GroupDesc d =
            proto::lay_out_group(numel, proto::Dtype::f32, proto::Dtype::none, false, 1);
        d.hyper = proto::Hyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0, 1, 1, 0};
        const int fd = memfd(d.segment_size, seals);
        ctl->groups[index] = d;
        assert_int_equal(proto::send_fd(sock, fd, index), 0);
        close(fd);
        ctl->ngroups = index;
        return run(proto::Command::add_group);
    }
};

// A control block that its trainer could still shrink is refused before the worker reads it.
void unsealed_control_block(void **) {
    Trainer t(0);
    t.start();
    assert_int_equal(t.exited_within(5000), static_cast<int>(proto::Exit::version));
}

// A group's memory that its trainer could shrink under the worker's mapping is refused; sealed,
// the same group is taken.
void unsealed_group_memory(void **) {
    Trainer t;
    t.start();
    t.await_ready();
    assert_int_equal(t.add_group(0, 1000, 0), ZB_EINTERNAL);
    assert_non_null(std::strstr(t.ctl->message, "sealed"));
    assert_int_equal(t.add_group(0, 1000, F_SEAL_SHRINK), ZB_OK);
    // A transfer segment likewise: get_state through an unsealed one is refused.
    const proto::TransferLayout layout = proto::transfer_layout(1000);
    const int fd = memfd(layout.size, 0);
    assert_int_equal(proto::send_fd(t.sock, fd, 0), 0);
    close(fd);
    t.ctl->ngroups = 0;
    t.ctl->transfer = proto::Transfer::segment;
    assert_int_equal(t.run(proto::Command::get_state), ZB_EINTERNAL);
    t.publish(proto::Command::exit);
    assert_int_equal(t.exited_within(5000), 0);
}

// A trainer that asked for a spin of hours and then died: the worker still notices within its
// bounded spin, instead of spinning on for the whole of it.
void huge_spin_then_trainer_dies(void **) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    const pid_t trainer = fork();
    assert_true(trainer >= 0);
    if (trainer == 0) {
        Trainer t(kSeals, UINT32_MAX);
        t.start();
        t.await_ready();
        const pid_t worker = t.pid;
        t.pid = -1; // left running: it must notice this process's death
        if (write(pipefd[1], &worker, sizeof worker) != sizeof worker) _exit(1);
        _exit(0);
    }
    close(pipefd[1]);
    pid_t worker = -1;
    assert_int_equal(read(pipefd[0], &worker, sizeof worker), sizeof worker);
    close(pipefd[0]);
    const int pidfd = proto::pidfd_open(worker);
    assert_true(pidfd >= 0);
    int status = 0;
    assert_int_equal(waitpid(trainer, &status, 0), trainer);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pollfd p{pidfd, POLLIN, 0};
    const int gone = poll(&p, 1, 5000);
    if (gone != 1) kill(worker, SIGKILL);
    close(pidfd);
    assert_int_equal(gone, 1);
}

// set_state's step count is the one the worker checked, even if the trainer rewrites it while the
// worker zeroes the moments.
void set_state_step_rewritten(void **) {
    Trainer t;
    t.start();
    t.await_ready();
    constexpr uint64_t n = uint64_t(16) << 20; // 128 MiB of moments: zeroing takes a while
    assert_int_equal(t.add_group(0, n, F_SEAL_SHRINK), ZB_OK);
    for (int attempt = 0; attempt < 5; ++attempt) {
        t.ctl->ngroups = 0;
        t.ctl->transfer = proto::Transfer::none; // set_state without moments: zero them
        t.ctl->step = 5;
        t.publish(proto::Command::set_state);
        const timespec pause{0, 2'000'000};
        nanosleep(&pause, nullptr);
        t.ctl->step = -7;                  // checked already: must not be what is set
        if (t.answer() != ZB_OK) continue; // seen before the check: refused, as it should be
        t.ctl->ngroups = 0;
        t.ctl->transfer = proto::Transfer::none;
        assert_int_equal(t.run(proto::Command::get_state), ZB_OK);
        assert_int_equal(t.ctl->state_step, 5);
    }
    t.publish(proto::Command::exit);
    assert_int_equal(t.exited_within(5000), 0);
}

} // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(unsealed_control_block),
        cmocka_unit_test(unsealed_group_memory),
        cmocka_unit_test(huge_spin_then_trainer_dies),
        cmocka_unit_test(set_state_step_rewritten),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
