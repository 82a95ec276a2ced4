# Cross build for 64-bit Arm (arm64) with Debian's cross toolchain and multiarch libraries
# (scripts/install-deps.sh installs g++-aarch64-linux-gnu, the arm64 -dev packages and
# qemu-user-static). The `aarch64` preset uses it; ctest runs the programs it builds through
# qemu-aarch64-static, which takes the arm64 loader and libraries from their multiarch paths.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# pkg-config reads arm64's .pc files (hwloc, numa), never the build machine's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
find_program(ZB_QEMU_AARCH64 qemu-aarch64-static)
if(ZB_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ZB_QEMU_AARCH64})
endif()
# Debian's layout for arm64: GNUInstallDirs uses the multiarch directory only when not cross
# compiling, and Slurm's PluginDir is where Debian's arm64 slurm-wlm packages keep their plugins.
set(CMAKE_INSTALL_LIBDIR lib/aarch64-linux-gnu CACHE PATH "Object code libraries (multiarch)")
set(ZB_SLURM_PLUGINDIR /usr/lib/aarch64-linux-gnu/slurm-wlm CACHE PATH "Slurm's PluginDir on arm64")
