#include "zbproto/header.hpp"

namespace zb::proto {

Header make_header() {
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.header_size = sizeof(Header);
    h.control_size = sizeof(Control);
    h.group_desc_size = sizeof(GroupDesc);
    h.max_groups = kMaxGroups;
    h.max_threads = kMaxThreads;
    h.segment_size = kControlSegment;
    return h;
}

std::string accept_header(Header &h, size_t mapped) {
    atomic(h.worker_version).store(kVersion, std::memory_order_release);
    if (h.magic != kMagic) return "fd 3 is not a zenflow control block (bad magic)";
    if (h.version != kVersion)
        return "the trainer's libzenbind speaks shared-memory layout " + std::to_string(h.version) +
               ", this worker " + std::to_string(kVersion) + ": install matching versions";
    if (h.header_size != sizeof(Header) || h.control_size != sizeof(Control) ||
        h.group_desc_size != sizeof(GroupDesc) || h.max_groups != kMaxGroups ||
        h.max_threads != kMaxThreads || h.segment_size != kControlSegment ||
        mapped < kControlSegment)
        return "the control block's layout sizes differ from this worker's (same version, "
               "different build): install matching versions";
    return "";
}

} // namespace zb::proto
