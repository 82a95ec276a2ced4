// The worker's pinned OpenMP team: one region alive for the worker's whole life, its master thread
// taking commands from the control block and the whole team executing them.
#pragma once

#include "shm_layout.hpp"

namespace zf::worker {

// Runs until the exit command or the trainer's death (parent_pidfd becomes readable). Returns the
// process exit code.
int run_team(zb::shm::Control &ctl, int socket_fd, int parent_pidfd);

} // namespace zf::worker
