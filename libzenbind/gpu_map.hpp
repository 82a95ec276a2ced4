// The admin's GPU map file (gpumap=, zenflow_bind(8) GPU MAP) and Slurm's GPU index lists: text
// that slurmstepd reads as root, so both parsers bound every length and number.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zb {

// Larger than any real map (one short line per GPU).
constexpr size_t max_map_bytes = 1u << 20;

struct MapEntry {
    unsigned index;  // GPU index, 0..ZB_GPU_MAX_INDEX
    unsigned node;   // NUMA node OS number, 0..ZB_CPULIST_MAX_ID
    std::string bus; // "dddd:bb:dd.f" in lower case, or ""
};

// Lines "INDEX NODE [BUS-ID]" separated by blanks, '#' comments and empty lines; each index once.
// Throws zb::Error(ZB_EINVAL) naming `name` and the line.
std::vector<MapEntry> parse_gpu_map(std::string_view text, std::string_view name);

// "0,1,5": decimal GPU indexes separated by commas, at least one. Throws zb::Error(ZB_EINVAL).
std::vector<unsigned> parse_gpu_list(std::string_view text);

} // namespace zb
