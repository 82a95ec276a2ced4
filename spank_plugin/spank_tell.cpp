#include "spank_tell.hpp"

#include <unistd.h>

#include <cerrno>

namespace zb::spank {

void tell_user(const std::string &line) {
    const std::string text = "zenflow-bind: " + line + "\n";
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = write(STDERR_FILENO, text.data() + done, text.size() - done);
        if (n > 0) {
            done += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return; // nobody listens; never block or fail the task over a message
        }
    }
}

} // namespace zb::spank
