#include "text_file.hpp"

#include "error.hpp"
#include "unique_fd.hpp"

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace zb {

std::optional<std::string> read_text_file(const std::string &path, size_t limit) {
    const UniqueFd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
    if (f.fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
        fail_errno("cannot open " + path);
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) fail_errno("cannot stat " + path);
    if (!S_ISREG(st.st_mode)) fail(ZB_EINVAL, path + " is not a regular file");
    std::string data;
    char chunk[8192];
    for (;;) {
        const ssize_t n = ::read(f.fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail_errno("cannot read " + path);
        if (n == 0) break;
        data.append(chunk, static_cast<size_t>(n));
        if (data.size() > limit)
            fail(ZB_EINVAL, path + " is larger than " + std::to_string(limit) + " bytes");
    }
    return data;
}

std::string require_text_file(const std::string &path, size_t limit) {
    auto data = read_text_file(path, limit);
    if (!data) {
        errno = ENOENT;
        fail_errno("cannot open " + path);
    }
    return std::move(*data);
}

} // namespace zb
