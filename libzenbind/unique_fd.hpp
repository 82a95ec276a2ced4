// A file descriptor closed when it goes out of scope (-1: none).
#pragma once

#include <unistd.h>

namespace zb {

struct UniqueFd {
    int fd = -1;
    UniqueFd() = default;
    explicit UniqueFd(int f) : fd(f) {}
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;
    ~UniqueFd() {
        if (fd >= 0) ::close(fd);
    }
};

} // namespace zb
