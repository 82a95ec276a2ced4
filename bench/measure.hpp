// What the benchmarks time with and allocate from: zenflow-bench's subcommands and
// deepspeed_pair.cpp (built outside CMake, from this header too).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
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

// Where and when a run measured: the CPU model, the kernel's transparent huge page mode (whether
// the 2 MiB-aligned buffers can be huge pages) and the 1-minute load average at its start and its
// end, which every subcommand prints beside its figures (a figure from a busy or unknown machine
// is not one to compare).
class Machine {
  public:
    Machine() : cpu_(cpu_model()), thp_(thp_mode()), load_start_(load()) {}

    // `"cpu": "...", "thp": "...", "load_start": x, "load_end": y`, to close a JSON object's keys.
    std::string json() const {
        char out[384];
        std::snprintf(out, sizeof out,
                      "\"cpu\": \"%s\", \"thp\": \"%s\", \"load_start\": %.2f, \"load_end\": %.2f",
                      cpu_.c_str(), thp_.c_str(), load_start_, load());
        return out;
    }
    // One line for a table.
    std::string text() const {
        char out[384];
        std::snprintf(
            out, sizeof out,
            "CPU %s, transparent huge pages %s, load %.2f at the start, %.2f at the end\n",
            cpu_.c_str(), thp_.c_str(), load_start_, load());
        return out;
    }

  private:
    // /proc/loadavg's first figure; -1 when it cannot be read.
    static double load() {
        double l = -1;
        if (FILE *f = std::fopen("/proc/loadavg", "re")) {
            if (std::fscanf(f, "%lf", &l) != 1) l = -1;
            std::fclose(f);
        }
        return l;
    }
    // The first "model name" of /proc/cpuinfo, printable ASCII without quotes or backslashes
    // (others become '?', so it stays one JSON string); "unknown" when there is none.
    static std::string cpu_model() {
        std::string name;
        if (FILE *f = std::fopen("/proc/cpuinfo", "re")) {
            char line[512];
            while (name.empty() && std::fgets(line, sizeof line, f))
                if (!std::strncmp(line, "model name", 10))
                    if (const char *colon = std::strchr(line, ':')) name = colon + 1;
            std::fclose(f);
        }
        const size_t first = name.find_first_not_of(" \t"), last = name.find_last_not_of(" \t\n");
        name =
            first == std::string::npos ? "" : name.substr(first, last - first + 1).substr(0, 200);
        for (char &c : name)
            if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') c = '?';
        return name.empty() ? "unknown" : name;
    }

    // The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled (always, madvise, never);
    // "unknown" when it cannot be read.
    static std::string thp_mode() {
        char mode[32] = "unknown";
        if (FILE *f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re")) {
            char word[64];
            while (std::fscanf(f, "%63s", word) == 1) {
                const size_t n = std::strlen(word);
                if (n > 2 && n - 2 < sizeof mode && word[0] == '[' && word[n - 1] == ']') {
                    std::memcpy(mode, word + 1, n - 2);
                    mode[n - 2] = '\0';
                }
            }
            std::fclose(f);
        }
        return mode;
    }

    std::string cpu_, thp_;
    double load_start_;
};

} // namespace zb::bench
