# Which Slurm the plugin is built for: spank.h's directory and the release in slurm_version.h.
# Slurm loads a SPANK plugin only when its plugin_version (SLURM_VERSION_NUMBER at build time)
# has the same major and minor release as Slurm itself, so the release series (24.11) is what a
# build targets; the micro release of the headers does not matter.
#
# Sets ZB_SLURM_INCLUDE_DIR, ZB_SLURM_SERIES ("24.11", written as Slurm writes it),
# ZB_SLURM_HEADERS_RELEASE ("24.11.5") and ZB_SLURM_VERSION_NUMBER (0x180b05).
# -DZB_SLURM_INCLUDE_DIR=/opt/slurm/include builds against another installation.
find_path(ZB_SLURM_INCLUDE_DIR slurm/spank.h REQUIRED
          DOC "The directory holding slurm/spank.h of the Slurm the plugin is built for")
set(zb_version_h ${ZB_SLURM_INCLUDE_DIR}/slurm/slurm_version.h)
if(NOT EXISTS ${zb_version_h})
  message(FATAL_ERROR "${zb_version_h} is missing: Slurm before 20.11 is not supported")
endif()
file(STRINGS ${zb_version_h} zb_slurm_version_line REGEX "^#define SLURM_VERSION_NUMBER")
string(REGEX MATCH "0x[0-9a-fA-F]+" ZB_SLURM_VERSION_NUMBER "${zb_slurm_version_line}")
if(NOT ZB_SLURM_VERSION_NUMBER)
  message(FATAL_ERROR "no SLURM_VERSION_NUMBER in ${zb_version_h}")
endif()
math(EXPR zb_slurm_major "(${ZB_SLURM_VERSION_NUMBER} >> 16) & 255")
math(EXPR zb_slurm_minor "(${ZB_SLURM_VERSION_NUMBER} >> 8) & 255")
math(EXPR zb_slurm_micro "${ZB_SLURM_VERSION_NUMBER} & 255")
# Slurm prints its releases with a two-digit minor ("%d.%02d.%d"): 22.05, 24.11.
if(zb_slurm_minor LESS 10)
  set(zb_slurm_minor "0${zb_slurm_minor}")
endif()
set(ZB_SLURM_SERIES "${zb_slurm_major}.${zb_slurm_minor}")
set(ZB_SLURM_HEADERS_RELEASE "${ZB_SLURM_SERIES}.${zb_slurm_micro}")
# The oldest release the plugin runs its test suite against (README "Slurm releases").
if(ZB_SLURM_VERSION_NUMBER LESS 0x160500)
  message(WARNING "Slurm ${ZB_SLURM_HEADERS_RELEASE} is older than 22.05, the oldest release "
                  "zenflow_bind.so is tested with")
endif()
message(STATUS "zenflow_bind.so targets Slurm ${ZB_SLURM_SERIES}.x (headers of "
               "${ZB_SLURM_HEADERS_RELEASE} in ${ZB_SLURM_INCLUDE_DIR}); Slurm refuses it "
               "under any other major.minor release")
