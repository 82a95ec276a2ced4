// Shared-memory fds travel from the trainer to the worker over their socket (SCM_RIGHTS), each
// with a tag that names what it is for. The trainer queues the fd before it publishes the command
// that uses it, so the worker receives without waiting.
#pragma once

#include <cstdint>

namespace zb::proto {

// Returns 0, or the errno of sendmsg (EAGAIN when the socket's buffer is full).
int send_fd(int sock, int fd, uint32_t tag);

// Receives one queued fd (close-on-exec) and its tag. Returns the fd, or -1 with errno set (EAGAIN:
// nothing queued; EPROTO: a message without exactly one fd, whose fds are closed).
int receive_fd(int sock, uint32_t &tag);

} // namespace zb::proto
