// zb_gpus_load on an arbitrary GPU map (gpumap=, which slurmstepd reads as root): a failure leaves
// a one-line message and no GPUs; a map that loads holds indexes and nodes in range, in index
// order without duplicates, and its canonical text loads back to the same GPUs.
#include "check.hpp"

#include <zenbind/zenbind.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace {

// The text goes into a memfd, read through its /proc path (the map is named by absolute path).
std::string put(int &fd, const char *name, const void *data, size_t size) {
    if (fd < 0) fd = memfd_create(name, 0);
    ZB_FUZZ_CHECK(fd >= 0);
    ZB_FUZZ_CHECK(ftruncate(fd, 0) == 0);
    ZB_FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
    return "/proc/self/fd/" + std::to_string(fd);
}

std::string canonical(const zb_gpus_t *gpus) {
    std::string text;
    for (unsigned i = 0; i < zb_gpus_count(gpus); ++i) {
        zb_gpu g;
        ZB_FUZZ_CHECK(zb_gpus_get(gpus, i, &g) == ZB_OK);
        text += std::to_string(g.index) + " " + std::to_string(g.numa_node) + " " + g.bus_id + "\n";
    }
    return text;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int input_fd = -1, saved_fd = -1;
    zb_gpus_t *gpus = nullptr;
    // An empty root: a map that fails must not fall back to discovering this machine's GPUs.
    if (zb_gpus_load("/nonexistent", put(input_fd, "map", data, size).c_str(), &gpus) != ZB_OK) {
        ZB_FUZZ_CHECK(gpus == nullptr);
        const char *msg = zb_last_error();
        ZB_FUZZ_CHECK(msg[0] != '\0' && std::strlen(msg) < 1024 && !std::strchr(msg, '\n'));
        return 0;
    }
    ZB_FUZZ_CHECK(zb_gpus_count(gpus) > 0);
    for (unsigned i = 0; i < zb_gpus_count(gpus); ++i) {
        zb_gpu g, found;
        ZB_FUZZ_CHECK(zb_gpus_get(gpus, i, &g) == ZB_OK);
        ZB_FUZZ_CHECK(g.index <= ZB_GPU_MAX_INDEX);
        ZB_FUZZ_CHECK(g.numa_node >= 0 && g.numa_node <= ZB_CPULIST_MAX_ID);
        const size_t bus = std::strlen(g.bus_id); // DOMAIN:BB:DD.F, a domain of 4 to 8 digits
        ZB_FUZZ_CHECK(bus == 0 || (bus >= 12 && bus <= 16 && g.bus_id[bus - 8] == ':'));
        ZB_FUZZ_CHECK(zb_gpus_find(gpus, g.index, &found) == ZB_OK && found.index == g.index);
        if (i > 0) {
            zb_gpu prev;
            ZB_FUZZ_CHECK(zb_gpus_get(gpus, i - 1, &prev) == ZB_OK && prev.index < g.index);
        }
    }
    const std::string text = canonical(gpus);
    zb_gpus_t *back = nullptr;
    if (zb_gpus_load(nullptr, put(saved_fd, "saved", text.data(), text.size()).c_str(), &back) !=
        ZB_OK) {
        std::fprintf(stderr, "canonical map does not load back: %s\n", zb_last_error());
        ZB_FUZZ_CHECK(false);
    }
    ZB_FUZZ_CHECK(canonical(back) == text);
    zb_gpus_free(back);
    zb_gpus_free(gpus);
    return 0;
}
