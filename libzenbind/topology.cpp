#include "topology.hpp"

#include "error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace {

enum class Source { live, xml, synthetic };

// hwloc builds a synthetic topology in time that grows with the square of a level's width (5 s
// for 4096 cores in one package, minutes for 70000 PUs): a description of more PUs than Linux
// runs on (NR_CPUS at most 8192) is refused before hwloc sees it.
constexpr uint64_t kMaxSyntheticPus = 8192;

// The PUs a synthetic description makes, the product of its levels' counts ("pack:2 [numa]
// core:16 pu:2(indexes=core:pack)": 64, "2 16 2" too), or 0 where a word is neither "type:count"
// nor a count (hwloc decides).
// Attributes in () and memory in [] are skipped; counting stops above kMaxSyntheticPus.
uint64_t synthetic_pus(std::string_view text) {
    uint64_t pus = 1;
    int nesting = 0;
    size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (c == '(' || c == '[') ++nesting;
        if ((c == ')' || c == ']') && nesting > 0) --nesting;
        if (nesting > 0 || c == ')' || c == ']' || c == ' ' || c == '\t' || c == '\n') {
            ++i;
            continue;
        }
        const size_t end = text.find_first_of(" \t\n([", i);
        const std::string_view word = text.substr(i, end - i);
        // "type:count", or a bare count (hwloc's older form, "2 8 2")
        const size_t colon = word.rfind(':');
        const std::string_view digits =
            colon == std::string_view::npos ? word : word.substr(colon + 1);
        if (digits.empty()) return 0;
        // as hwloc reads it (strtoul's base 0): 0x hexadecimal, a leading 0 octal, else decimal
        const bool hex = digits.size() > 2 && digits[0] == '0' && (digits[1] | 0x20) == 'x';
        const unsigned base = hex ? 16 : digits.size() > 1 && digits[0] == '0' ? 8 : 10;
        uint64_t count = 0;
        for (const char digit : digits.substr(hex ? 2 : 0)) {
            const char lower = static_cast<char>(digit | 0x20);
            const unsigned d = digit >= '0' && digit <= '9'   ? unsigned(digit - '0')
                               : lower >= 'a' && lower <= 'f' ? unsigned(lower - 'a' + 10)
                                                              : 16u;
            if (d >= base) return 0;
            count = std::min<uint64_t>(count * base + d, kMaxSyntheticPus + 1);
        }
        pus = std::min<uint64_t>(pus * count, kMaxSyntheticPus + 1);
        i = end == std::string_view::npos ? text.size() : end;
    }
    return pus;
}

[[noreturn]] void unreadable_xml(const char *path, const char *why) {
    zb::fail(ZB_ETOPOLOGY, std::string("cannot read hwloc XML topology '") + path + "'" +
                               (why ? std::string(": ") + why : std::string()));
}

// hwloc says only that it could not read a file: say why, before it tries.
void check_readable(const char *path) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) unreadable_xml(path, std::strerror(errno));
    struct stat st {};
    const bool directory = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    if (directory) unreadable_xml(path, std::strerror(EISDIR));
}

zb_topology_t *load(Source source, const char *arg) {
    auto t = std::make_unique<zb_topology>();
    if (hwloc_topology_init(&t->topo) != 0) zb::fail_errno("hwloc_topology_init");
    hwloc_topology_set_flags(t->topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
    // Only CPUs, caches and memory matter here; I/O discovery costs time in slurmstepd.
    hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    if (source == Source::xml) check_readable(arg);
    if (source == Source::xml && hwloc_topology_set_xml(t->topo, arg) != 0)
        unreadable_xml(arg, nullptr);
    if (source == Source::synthetic && synthetic_pus(arg) > kMaxSyntheticPus)
        zb::fail(ZB_ETOPOLOGY, std::string("hwloc synthetic topology '") + arg +
                                   "' has more than " + std::to_string(kMaxSyntheticPus) + " PUs");
    if (source == Source::synthetic && hwloc_topology_set_synthetic(t->topo, arg) != 0)
        zb::fail(ZB_ETOPOLOGY, std::string("invalid hwloc synthetic topology '") + arg + "'");
    if (hwloc_topology_load(t->topo) != 0) {
        const std::string what =
            source == Source::live ? std::string("this machine") : std::string("'") + arg + "'";
        zb::fail(ZB_ETOPOLOGY,
                 "cannot load the topology of " + what +
                     (source == Source::xml ? " (not an XML export of hwloc's lstopo?)" : ""));
    }
    if (hwloc_bitmap_iszero(hwloc_topology_get_topology_cpuset(t->topo)))
        zb::fail(ZB_ETOPOLOGY, "the topology has no CPUs");
    return t.release();
}

zb_status load_into(Source source, const char *arg, zb_topology_t **out) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_topology_load: out is NULL");
        if (source != Source::live && (!arg || !*arg))
            zb::fail(ZB_EINVAL, "zb_topology_load: empty topology source");
        *out = load(source, arg);
    });
}

} // namespace

extern "C" {

zb_status zb_topology_load(zb_topology_t **out) {
    return load_into(Source::live, nullptr, out);
}

zb_status zb_topology_load_xml(const char *path, zb_topology_t **out) {
    return load_into(Source::xml, path, out);
}

zb_status zb_topology_load_synthetic(const char *description, zb_topology_t **out) {
    return load_into(Source::synthetic, description, out);
}

void zb_topology_free(zb_topology_t *topology) {
    delete topology;
}

hwloc_topology_t zb_topology_hwloc(const zb_topology_t *topology) {
    return topology ? topology->topo : nullptr;
}

const zb_cpuset_t *zb_topology_cpuset(const zb_topology_t *topology) {
    return topology ? zb_cpuset_from_hwloc_const(hwloc_topology_get_topology_cpuset(topology->topo))
                    : nullptr;
}
}
