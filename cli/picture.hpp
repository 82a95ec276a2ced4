// `zenbind plan --picture FILE`: the node as lstopo draws it, each task's training and optimizer
// CPUs coloured, with a legend.
#pragma once

#include <zenbind/zenbind.h>

#include <string>

namespace zb::cli {

// lstopo's output format for FILE's name ("nativesvg" for .svg, "png" for .png); nullptr for any
// other name.
const char *picture_format(const std::string &file);

// Writes the picture (.svg or .png, from FILE's name) of `plan` on `topology`; false with
// `error` set when it cannot (unknown extension, no lstopo, lstopo failing).
bool draw_plan(zb_topology_t *topology, const zb_plan_t *plan, const std::string &file,
               std::string &error);

} // namespace zb::cli
