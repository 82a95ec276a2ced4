// The worker's pinned OpenMP team: one region alive for the worker's whole life, its master thread
// taking commands from the control block and the whole team executing them.
#pragma once

#include <zbproto/layout.hpp>

namespace zb::opt::worker {

// Runs until the exit command or the trainer's death (parent_pidfd becomes readable). Returns the
// process exit code.
zb::proto::Exit run_team(zb::proto::Control &ctl, int socket_fd, int parent_pidfd);

} // namespace zb::opt::worker
