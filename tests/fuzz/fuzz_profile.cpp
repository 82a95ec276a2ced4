// zb_profile_load on arbitrary file contents: a failure leaves a one-line message and no profile;
// a profile that loads saves to a file that loads back with the same saturation on every node.
#include "check.hpp"

#include <zenbind/zenbind.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace {

// The input goes into a memfd, read through its /proc path (profiles are loaded by absolute path).
std::string input_path(const uint8_t *data, size_t size) {
    static const int fd = memfd_create("fuzz_profile", 0);
    ZB_FUZZ_CHECK(fd >= 0);
    ZB_FUZZ_CHECK(ftruncate(fd, 0) == 0);
    ZB_FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
    return "/proc/self/fd/" + std::to_string(fd);
}

const std::string &saved_path() {
    static const std::string path = "/tmp/fuzz_profile." + std::to_string(getpid());
    return path;
}

constexpr unsigned kNodesChecked = 300;

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zb_profile_t *p = nullptr;
    if (zb_profile_load(input_path(data, size).c_str(), &p) != ZB_OK) {
        ZB_FUZZ_CHECK(p == nullptr);
        const char *msg = zb_last_error();
        ZB_FUZZ_CHECK(msg[0] != '\0' && std::strlen(msg) < 1024 && !std::strchr(msg, '\n'));
        return 0;
    }
    ZB_FUZZ_CHECK(zb_profile_save(p, saved_path().c_str()) == ZB_OK);
    zb_profile_t *back = nullptr;
    if (zb_profile_load(saved_path().c_str(), &back) != ZB_OK) {
        std::fprintf(stderr, "saved profile does not load back: %s\n", zb_last_error());
        ZB_FUZZ_CHECK(false);
    }
    for (unsigned node = 0; node < kNodesChecked; ++node)
        ZB_FUZZ_CHECK(zb_profile_saturation(p, node) == zb_profile_saturation(back, node));
    zb_profile_free(back);
    zb_profile_free(p);
    std::remove(saved_path().c_str());
    return 0;
}
