// What the benchmarks time with and allocate from: zenflow-bench's subcommands and
// deepspeed_pair.cpp (built outside CMake, from this header too).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace zb::bench {

inline double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

struct Free {
    void operator()(void *p) const { std::free(p); }
};
template <class T> using Buffer = std::unique_ptr<T[], Free>;

// n elements on 2 MiB boundaries (so on pages, like the worker's buffers and unlike malloc's,
// which start 16 bytes into one), not written: the first thread that writes a page places it.
// Empty for n = 0; exits with a message naming `who` when memory runs out.
template <class T> Buffer<T> untouched(size_t n, const char *who) {
    if (n == 0) return nullptr;
    const size_t align = size_t{2} << 20, bytes = (n * sizeof(T) + align - 1) / align * align;
    void *p = std::aligned_alloc(align, bytes);
    if (!p) {
        std::fprintf(stderr, "%s: cannot allocate %zu bytes\n", who, bytes);
        std::exit(1);
    }
    return Buffer<T>(static_cast<T *>(p));
}

} // namespace zb::bench
