# `cpack -G DEB` in a build directory makes one Debian package per component, split as Debian
# splits such software, so each machine installs what it runs:
#   libzenbindN            the runtime library (N: ZB_SOVERSION)            (component lib)
#   libzenbind-dev         headers, libzenbind.so, CMake and pkg-config     (dev)
#   zenflow-bind           zenbind, zenflow-bench, the zenflow-optimizer worker (tools)
#   zenflow-bind-slurm     the SPANK plugin, its binder, the plugstack.conf.d snippet (slurm)
#   python3-zenflow-bind   the zenflow_bind Python package                  (python)
# install() calls without a COMPONENT belong to tools (CMAKE_INSTALL_DEFAULT_COMPONENT_NAME).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME zenflow-bind)
set(CPACK_PACKAGE_VENDOR "zenflow-bind developers")
set(ZB_PACKAGE_MAINTAINER "zenflow-bind developers <zenflow-bind@zenflow-bind.invalid>"
    CACHE STRING "Maintainer field of the packages (a site rebuilding them sets its own)")
set(CPACK_PACKAGE_CONTACT "${ZB_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Each package's first description line is its own (CPACK_DEBIAN_<COMP>_DESCRIPTION), not the
# project's one-line summary prepended to all of them.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev tools python)
if(ZB_BUILD_PLUGIN)
  list(APPEND CPACK_COMPONENTS_ALL slurm)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# A cross build (the aarch64 preset) packages for the machine it builds for: CPack would take the
# build machine's dpkg architecture. dpkg-shlibdeps reads the target's libraries from multiarch.
if(CMAKE_CROSSCOMPILING)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
    set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
  else()
    message(WARNING "cpack: no Debian architecture known for ${CMAKE_SYSTEM_PROCESSOR}")
  endif()
  set(CPACK_RPM_PACKAGE_ARCHITECTURE ${CMAKE_SYSTEM_PROCESSOR})
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps finds libzenbind.so.N in the build tree; the Depends on libzenbindN is written
# out below, since the package that provides its shlibs is built in the same run.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR}/libzenbind)
set(zb_same "(= ${PROJECT_VERSION})")

# contrib/packaging/scripts/NAME as a package's maintainer script, at DEST in the build tree.
function(zb_maintainer_script name dest)
  get_filename_component(dir ${CMAKE_BINARY_DIR}/${dest} DIRECTORY)
  get_filename_component(file ${dest} NAME)
  configure_file(${PROJECT_SOURCE_DIR}/contrib/packaging/scripts/${name} ${dir}/${file} COPYONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                  WORLD_READ WORLD_EXECUTE)
endfunction()

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libzenbind${ZB_SOVERSION})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# shlibs and the ldconfig trigger written here: CPack would call ldconfig from maintainer scripts,
# which Debian replaced by the trigger; scripts of our own (that do nothing) keep CPack's out.
file(WRITE ${CMAKE_BINARY_DIR}/cpack-lib/shlibs
     "libzenbind ${ZB_SOVERSION} libzenbind${ZB_SOVERSION} (>= ${PROJECT_VERSION})\n")
file(WRITE ${CMAKE_BINARY_DIR}/cpack-lib/triggers "activate-noawait ldconfig\n")
foreach(script postinst postrm)
  file(WRITE ${CMAKE_BINARY_DIR}/cpack-lib/${script} "#!/bin/sh\nset -e\nexit 0\n")
  file(CHMOD ${CMAKE_BINARY_DIR}/cpack-lib/${script} PERMISSIONS OWNER_READ OWNER_WRITE
       OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/cpack-lib/shlibs ${CMAKE_BINARY_DIR}/cpack-lib/triggers
    ${CMAKE_BINARY_DIR}/cpack-lib/postinst ${CMAKE_BINARY_DIR}/cpack-lib/postrm)
set(CPACK_DEBIAN_LIB_DESCRIPTION "NUMA-aware CPU planning and optimizer-worker library
libzenbind plans how a Slurm job step's CPUs divide among its local tasks and,
inside each task, between training and a CPU optimizer worker (NUMA-aware,
whole cores first), and drives that worker over shared memory. This package
holds the shared library used by the plugin, the tools and the Python package.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libzenbind-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# pkg-config: the CMake package finds hwloc with it
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libzenbind${ZB_SOVERSION} ${zb_same}, libhwloc-dev, pkgconf")
set(CPACK_DEBIAN_DEV_DESCRIPTION "development files of libzenbind
The C headers (zenbind/zenbind.h, worker.h, adam.h, hwloc.h), the
libzenbind.so link, the CMake package (find_package(zenbind)) and the
pkg-config file, and the libzenbind(3) manual page, for programs that plan
CPUs, drive the zenflow-optimizer worker or step Adam in their own process.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME zenflow-bind)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libzenbind${ZB_SOVERSION} ${zb_same}")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "CPU Adam worker and planning tools for offloaded training
zenflow-optimizer runs Adam/AdamW for a training process on CPUs of its own,
pinned and NUMA-local, driven over shared memory. zenbind previews the plans
of the Slurm plugin for any machine and measures where the optimizer
saturates memory; zenflow-bench measures the kernels and the worker.")

set(CPACK_DEBIAN_SLURM_PACKAGE_NAME zenflow-bind-slurm)
set(CPACK_DEBIAN_SLURM_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_SLURM_DESCRIPTION "Slurm SPANK plugin: srun --zenflow-bind
Splits each job step's CPUs on every node among its local tasks and, inside
each task, between training and its CPU optimizer worker, binds the tasks and
exports OMP_NUM_THREADS and ZENFLOW_* variables. Installed disabled: the
administrator uncomments one line of the plugstack.conf.d snippet.")
# Slurm loads only plugins built for its own release. srun (slurm-client) and slurmstepd
# (slurmd) both come with slurm-wlm-basic-plugins, so the pin is on it: it holds on a login node,
# a compute node and a workstation alike. A Pre-Depends, as dpkg checks it before unpacking: with
# a Depends, `dpkg -i` of a build for another release replaced the working plugin with one no
# srun loads, and apt's --fix-broken then removed the package without running its prerm.
if(ZB_BUILD_PLUGIN)
  # The release series of the spank.h the plugin was built against (22.05 for 22.05.8).
  set(zb_r ${ZB_SLURM_SERIES})
  set(CPACK_DEBIAN_SLURM_PACKAGE_PREDEPENDS
      "slurm-wlm-basic-plugins (>= ${zb_r}), slurm-wlm-basic-plugins (<< ${zb_r}.99)")
  set(CPACK_DEBIAN_SLURM_PACKAGE_DEPENDS "libzenbind${ZB_SOVERSION} ${zb_same}")
  set(CPACK_DEBIAN_SLURM_PACKAGE_RECOMMENDS "zenflow-bind ${zb_same}")
  # The snippet is the admin's to edit (enabling the plugin is uncommenting a line): a conffile,
  # so upgrades keep the admin's version.
  file(WRITE ${CMAKE_BINARY_DIR}/cpack-slurm/conffiles
       "${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm/plugstack.conf.d/zenflow-bind.conf\n")
  # Removal is refused while plugstack.conf loads the plugin as required (every srun would fail).
  zb_maintainer_script(zenflow-bind-slurm.prerm cpack-slurm/prerm)
  set(CPACK_DEBIAN_SLURM_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/cpack-slurm/conffiles
                                               ${CMAKE_BINARY_DIR}/cpack-slurm/prerm)
endif()

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-zenflow-bind)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3, python3-numpy, libzenbind${ZB_SOVERSION} ${zb_same}, zenflow-bind ${zb_same}")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "python3-torch")
# Its byte-code compiled at install and removed before removal, as dh_python3 does.
zb_maintainer_script(python3-zenflow-bind.postinst cpack-python/postinst)
zb_maintainer_script(python3-zenflow-bind.prerm cpack-python/prerm)
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/cpack-python/postinst
                                              ${CMAKE_BINARY_DIR}/cpack-python/prerm)
set(CPACK_DEBIAN_PYTHON_DESCRIPTION "Python interface of zenflow-bind for PyTorch and DeepSpeed
zenflow_bind.optim.AdamW is a torch.optim.Optimizer whose step runs in the
zenflow-optimizer worker on the CPUs srun --zenflow-bind planned, with torch's
state dict format; zenflow_bind.deepspeed makes DeepSpeed ZenFlow use the
plugin's plan. Worker and Group expose the worker's shared memory to numpy.")

# `cpack -G RPM` makes the same split for RHEL-family sites, from a build configured with their
# layout (tests/package/test_rpm.sh): -DCMAKE_INSTALL_LIBDIR=lib64
# -DZB_SLURM_PLUGINDIR=/usr/lib64/slurm -DZB_PYTHON_DIR=lib/python3.X/site-packages.
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_RPM_PACKAGE_LICENSE "none chosen yet")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Base")
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_AUTOREQ ON)
set(CPACK_RPM_LIB_PACKAGE_NAME libzenbind)
set(CPACK_RPM_DEV_PACKAGE_NAME libzenbind-devel)
set(CPACK_RPM_DEV_PACKAGE_REQUIRES "libzenbind = ${PROJECT_VERSION}, hwloc-devel")
set(CPACK_RPM_TOOLS_PACKAGE_NAME zenflow-bind)
set(CPACK_RPM_TOOLS_PACKAGE_REQUIRES "libzenbind = ${PROJECT_VERSION}")
set(CPACK_RPM_SLURM_PACKAGE_NAME zenflow-bind-slurm)
set(CPACK_RPM_PYTHON_PACKAGE_NAME python3-zenflow-bind)
set(CPACK_RPM_PYTHON_PACKAGE_ARCHITECTURE noarch)
set(CPACK_RPM_PYTHON_PACKAGE_REQUIRES
    "python3, python3-numpy, libzenbind = ${PROJECT_VERSION}, zenflow-bind = ${PROJECT_VERSION}")
foreach(comp LIB DEV TOOLS SLURM PYTHON)
  string(REGEX REPLACE "\n.*" "" zb_summary "${CPACK_DEBIAN_${comp}_DESCRIPTION}")
  string(REGEX REPLACE "^[^\n]*\n" "" zb_long "${CPACK_DEBIAN_${comp}_DESCRIPTION}")
  set(CPACK_RPM_${comp}_PACKAGE_SUMMARY "${zb_summary}")
  set(CPACK_RPM_${comp}_PACKAGE_DESCRIPTION "${zb_long}")
endforeach()
if(ZB_BUILD_PLUGIN)
  # RHEL-family Slurm ships srun, slurmstepd and the plugins in the "slurm" package.
  set(CPACK_RPM_SLURM_PACKAGE_REQUIRES
      "libzenbind = ${PROJECT_VERSION}, slurm >= ${zb_r}, slurm < ${zb_r}.99")
  # The snippet is the admin's: an upgrade keeps an edited one.
  set(CPACK_RPM_SLURM_USER_FILELIST
      "%config(noreplace) ${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm/plugstack.conf.d/zenflow-bind.conf")
  set(CPACK_RPM_SLURM_PRE_UNINSTALL_SCRIPT_FILE ${CMAKE_BINARY_DIR}/cpack-slurm/prerm)
endif()
# Directories other packages own.
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
    ${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm ${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm/plugstack.conf.d
    /usr/lib64/slurm /usr/libexec /usr/share/doc /usr/share/man /usr/share/man/man1
    /usr/share/man/man3 /usr/share/man/man8 /usr/lib/python3 /usr/lib64/pkgconfig /usr/lib64/cmake)

# Each package carries the copyright file and the changelog Debian policy asks for.
set(zb_changelog ${CMAKE_BINARY_DIR}/cpack-doc/changelog.gz)
add_custom_command(OUTPUT ${zb_changelog}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/cpack-doc
  COMMAND gzip -9n -c ${PROJECT_SOURCE_DIR}/contrib/packaging/debian/changelog > ${zb_changelog}
  DEPENDS ${PROJECT_SOURCE_DIR}/contrib/packaging/debian/changelog VERBATIM)
add_custom_target(zb_package_doc ALL DEPENDS ${zb_changelog})
foreach(comp IN LISTS CPACK_COMPONENTS_ALL)
  string(TOUPPER ${comp} COMP)
  install(FILES ${PROJECT_SOURCE_DIR}/contrib/packaging/debian/copyright ${zb_changelog}
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${CPACK_DEBIAN_${COMP}_PACKAGE_NAME}
          COMPONENT ${comp})
endforeach()
include(CPack)
