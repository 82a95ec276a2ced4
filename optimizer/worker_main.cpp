// zenflow-optimizer: the optimizer worker that libzenbind's zb_worker_spawn() starts. It inherits
// the control segment as fd 3 and a socket to its trainer as fd 4, refuses a header of another
// layout version, and exits when the trainer dies. Not meant to be started by hand.
#include "worker_team.hpp"

#include <zbproto/header.hpp>
#include <zbproto/layout.hpp>
#include <zbproto/pidfd.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace proto = zb::proto;

[[noreturn]] void refuse(const std::string &why) {
    std::fprintf(stderr, "zenflow-optimizer: %s\n", why.c_str());
    std::exit(static_cast<int>(proto::Exit::version));
}

} // namespace

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("zenflow-optimizer %s (shared-memory layout %u)\n", ZB_VERSION_STRING,
                    proto::kVersion);
        return static_cast<int>(proto::Exit::ok);
    }
    if (argc > 1) {
        std::fprintf(stderr, "usage: zenflow-optimizer [--version]\n"
                             "Started by libzenbind (zb_worker_spawn), with its control block as "
                             "fd 3 and a socket as fd 4; see zenflow-optimizer(1).\n");
        return static_cast<int>(proto::Exit::usage);
    }
    // Signals meant for the job reach every process of it: Ctrl-C the process group, and Slurm's
    // SIGTERM (scancel, the time limit, preemption) and --signal's choice every process of the
    // step. They are the trainer's to act on, and a trainer that saves a checkpoint on one needs
    // this process to hold the Adam moments until it has; we go when the trainer does (its
    // pidfd), and SIGKILL still ends us.
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2})
        std::signal(sig, SIG_IGN);
    struct stat st {};
    if (fstat(proto::kControlFd, &st) != 0 ||
        static_cast<size_t>(st.st_size) < sizeof(proto::Header))
        refuse("fd 3 is not a control block (start me through zb_worker_spawn)");
    void *base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                      proto::kControlFd, 0);
    if (base == MAP_FAILED) refuse("cannot map fd 3");
    const std::string why =
        proto::accept_header(*static_cast<proto::Header *>(base), static_cast<size_t>(st.st_size));
    if (!why.empty()) refuse(why);
    // After the version check (a trainer of another layout is told that first): a control block
    // its trainer could still shrink would turn our next read of it into SIGBUS.
    const int seals = fcntl(proto::kControlFd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        refuse("fd 3 is not sealed against shrinking (start me through zb_worker_spawn)");
    proto::Control &ctl = *proto::control_of(base);

    // Stopped (SIGSTOP) when the trainer dies, we could never see its pidfd: its death sends us
    // SIGCONT, which wakes a stopped process and does nothing to a running one (as when the
    // thread that started us ends, which the kernel counts as the parent's death too). The
    // kernel wakes a stopped orphaned process group by itself only where the trainer's parent
    // is in another group of its session: not for a trainer leading its own session.
    prctl(PR_SET_PDEATHSIG, SIGCONT);
    // Watch the trainer through a pidfd, then confirm it is still our parent: if it died before
    // pidfd_open (or before the line above), the pid may be reused, but we would have been
    // reparented already.
    const int parent = proto::pidfd_open(ctl.trainer_pid);
    if (parent < 0 || getppid() != ctl.trainer_pid) return static_cast<int>(proto::Exit::ok);
    return static_cast<int>(zb::opt::worker::run_team(ctl, proto::kSocketFd, parent));
}
