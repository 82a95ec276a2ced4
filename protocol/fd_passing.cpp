#include "zbproto/fd_passing.hpp"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <unistd.h>

namespace zb::proto {
namespace {

// A message of one 32-bit tag and a control buffer for the fds, as both directions use it.
msghdr tag_message(iovec &iov, char *control, size_t control_len) {
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = control_len;
    return msg;
}

} // namespace

int send_fd(int sock, int fd, uint32_t tag) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{&tag, sizeof tag};
    msghdr msg = tag_message(iov, control, sizeof control);
    cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    const ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent == static_cast<ssize_t>(sizeof tag)) return 0;
    return sent < 0 ? errno : EPROTO;
}

int receive_fd(int sock, uint32_t &tag) {
    // Room for more than one fd, so that a malformed message cannot leak the extra ones.
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    iovec iov{&tag, sizeof tag};
    msghdr msg = tag_message(iov, control, sizeof control);
    const ssize_t got = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return -1;
    int fd = -1, fds = 0;
    for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; ++i) {
            int one;
            std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof one);
            if (fds++ == 0)
                fd = one;
            else
                close(one);
        }
    }
    if (got == static_cast<ssize_t>(sizeof tag) && fds == 1 && !(msg.msg_flags & MSG_CTRUNC))
        return fd;
    if (fd >= 0) close(fd);
    errno = EPROTO;
    return -1;
}

} // namespace zb::proto
