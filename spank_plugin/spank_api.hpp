// spank.h declares the slurm_spank_* callbacks before its own extern "C" block, so C++ has to
// include it inside one: otherwise the plugin's definitions clash with C++-linkage declarations.
#pragma once

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_version.h>
#include <slurm/spank.h>
}

// What the plugin takes from Slurm, compared between 22.05 and 24.11 (spank.h, slurm.h, and the
// SPANK implementation, src/common/plugstack.c then spank.c): the callbacks, spank_get_item's
// items (S_STEP_ALLOC_CORES: the step's cores on this node from its credential, both releases),
// the step ids SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT and SLURM_INTERACTIVE_STEP (same values),
// and the option's export to the job as SLURM_SPANK__SLURM_SPANK_OPTION_zenflow_bind_zenflow_bind
// (same name and "(null)" for an option given without a value) are the same. 24.11 only adds
// spank_prepend_task_argv(), which the plugin does not use. Older releases lack what follows.
#if SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(20, 11, 0)
#error "zenflow_bind.so needs Slurm 20.11 or later: SLURM_INTERACTIVE_STEP (salloc's step)"
#endif
