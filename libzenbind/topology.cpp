#include "topology.hpp"

#include "error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

namespace {

enum class Source { live, xml, synthetic };

// hwloc says only that it could not read a file: say why, before it tries.
void check_readable(const char *path) {
    const std::string what = std::string("cannot read hwloc XML topology '") + path + "': ";
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) zb::fail(ZB_ETOPOLOGY, what + std::strerror(errno));
    struct stat st {};
    const bool directory = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    if (directory) zb::fail(ZB_ETOPOLOGY, what + std::strerror(EISDIR));
}

zb_topology_t *load(Source source, const char *arg) {
    auto t = std::make_unique<zb_topology>();
    if (hwloc_topology_init(&t->topo) != 0) zb::fail_errno("hwloc_topology_init");
    hwloc_topology_set_flags(t->topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
    // Only CPUs, caches and memory matter here; I/O discovery costs time in slurmstepd.
    hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    if (source == Source::xml) check_readable(arg);
    if (source == Source::xml && hwloc_topology_set_xml(t->topo, arg) != 0)
        zb::fail(ZB_ETOPOLOGY, std::string("cannot read hwloc XML topology '") + arg + "'");
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
