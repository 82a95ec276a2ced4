# `cpack -G DEB` (run in a build directory) makes one Debian package with everything that
# `cmake --install` installs: library, headers, CLI, worker, plugin in Slurm's PluginDir, man pages
# and the plugstack.conf.d snippet (installed disabled: the admin enables it).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME zenflow-bind)
set(CPACK_PACKAGE_VENDOR "zenflow-bind developers")
set(CPACK_PACKAGE_CONTACT "zenflow-bind developers <zenflow-bind@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Slurm loads only plugins built for its own release: pin srun's package to the release of the
# spank.h this build used (Debian's libslurm-dev, e.g. 22.05.8-4 -> 22.05).
if(ZB_BUILD_PLUGIN)
  execute_process(COMMAND dpkg-query -W -f=\${Version} libslurm-dev
                  OUTPUT_VARIABLE zb_slurm_deb_version ERROR_QUIET)
  if(zb_slurm_deb_version MATCHES "^([0-9]+\\.[0-9]+)")
    set(CPACK_DEBIAN_PACKAGE_DEPENDS
        "slurm-client (>= ${CMAKE_MATCH_1}), slurm-client (<< ${CMAKE_MATCH_1}.99)")
  endif()
endif()
# The Python package (dist-packages/zenflow_bind) imports numpy; torch is the user's own.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-numpy")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"${PROJECT_DESCRIPTION}
 A Slurm SPANK plugin (srun --zenflow-bind) that splits each step's cgroup
 cpuset among local tasks and between each task's training process and its
 CPU optimizer worker, the libzenbind library and zenbind CLI behind it, and
 the zenflow-optimizer Adam/AdamW worker process.")
include(CPack)
