// spank.h declares the slurm_spank_* callbacks before its own extern "C" block, so C++ has to
// include it inside one: otherwise the plugin's definitions clash with C++-linkage declarations.
#pragma once

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}
