// zenflow-optimizer: the optimizer worker that libzenbind's zb_worker_spawn() starts. It inherits
// the control segment as fd 3 and a socket to its trainer as fd 4, refuses a header of another
// layout version, and exits when the trainer dies. Not meant to be started by hand.
#include "shm_layout.hpp"
#include "shm_process.hpp"
#include "worker_team.hpp"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace shm = zb::shm;

[[noreturn]] void refuse(const char *why) {
    std::fprintf(stderr, "zenflow-optimizer: %s\n", why);
    std::exit(shm::kExitVersion);
}

// Both sides check the header: the trainer reads worker_version, the worker every size.
void check_header(shm::Header &h, size_t mapped) {
    shm::atomic(h.worker_version).store(shm::kVersion, std::memory_order_release);
    char why[256];
    if (h.magic != shm::kMagic) refuse("fd 3 is not a zenflow control block (bad magic)");
    if (h.version != shm::kVersion) {
        std::snprintf(why, sizeof why,
                      "the trainer's libzenbind speaks shared-memory layout %u, this worker %u: "
                      "install matching versions",
                      h.version, shm::kVersion);
        refuse(why);
    }
    if (h.header_size != sizeof(shm::Header) || h.control_size != sizeof(shm::Control) ||
        h.group_desc_size != sizeof(shm::GroupDesc) || h.max_groups != shm::kMaxGroups ||
        h.max_threads != shm::kMaxThreads || h.segment_size != shm::kControlSegment ||
        mapped < shm::kControlSegment)
        refuse("the control block's layout sizes differ from this worker's (same version, "
               "different build): install matching versions");
}

} // namespace

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("zenflow-optimizer %s (shared-memory layout %u)\n", ZB_VERSION_STRING,
                    shm::kVersion);
        return 0;
    }
    if (argc > 1) {
        std::fprintf(stderr, "usage: zenflow-optimizer [--version]\n"
                             "Started by libzenbind (zb_worker_spawn), with its control block as "
                             "fd 3 and a socket as fd 4; see zenflow-optimizer(1).\n");
        return 2;
    }
    // Ctrl-C reaches the whole process group: let the trainer handle it and take us down.
    std::signal(SIGINT, SIG_IGN);
    struct stat st {};
    if (fstat(shm::kControlFd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(shm::Header))
        refuse("fd 3 is not a control block (start me through zb_worker_spawn)");
    void *base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                      shm::kControlFd, 0);
    if (base == MAP_FAILED) refuse("cannot map fd 3");
    auto &header = *static_cast<shm::Header *>(base);
    check_header(header, static_cast<size_t>(st.st_size));
    shm::Control &ctl = *shm::control_of(base);

    // Watch the trainer through a pidfd, then confirm it is still our parent: if it died before
    // pidfd_open, the pid may be reused, but we would have been reparented already.
    const int parent = shm::pidfd_open(ctl.trainer_pid);
    if (parent < 0 || getppid() != ctl.trainer_pid) return 0;
    return zf::worker::run_team(ctl, shm::kSocketFd, parent);
}
