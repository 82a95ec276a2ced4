#!/usr/bin/env bash
# The RPM packages for RHEL-family sites, built by the same CMake with their layout (lib64, Slurm's
# /usr/lib64/slurm, site-packages), checked with rpm: files, requirements, the snippet
# %config(noreplace).   usage: test_rpm.sh SOURCE_DIR [BUILD_DIR]   (BUILD_DIR reused if given)
. "$(dirname "$0")/common.sh"
src=$1
build=${2:-$work/build}
command -v rpmbuild >/dev/null || { echo "FAIL rpmbuild is missing (scripts/install-deps.sh installs rpm)"; exit 1; }
py=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_INSTALL_LIBDIR=lib64 -DZB_SLURM_PLUGINDIR=/usr/lib64/slurm \
  -DZB_PYTHON_DIR="lib/python$py/site-packages" -DZB_BUILD_TESTS=OFF >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; exit 1; }
cmake --build "$build" --parallel >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
(cd "$work" && cpack -G RPM --config "$build/CPackConfig.cmake" -B "$work/out" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; exit 1; }

fail=0
rpm_of() { ls "$work"/out/"$1"-[0-9]*.rpm 2>/dev/null | head -1; }
has() { # has PACKAGE PATH WHAT
  # The list first: under pipefail, grep -q quitting at its match can end rpm with SIGPIPE and
  # fail the pipe, which read as a missing file now and then.
  local files
  files=$(rpm -qlp "$(rpm_of "$1")" 2>/dev/null) || true
  if grep -qx "$2" <<<"$files"; then echo "ok   $1: $3 ($2)"
  else echo "FAIL $1 lacks $3 ($2)"; fail=1; fi
}
for p in libzenbind libzenbind-devel zenflow-bind zenflow-bind-slurm python3-zenflow-bind; do
  [ -n "$(rpm_of "$p")" ] || { echo "FAIL no package $p"; fail=1; }
done
has libzenbind /usr/lib64/libzenbind.so.$so "the library"
has libzenbind-devel /usr/include/zenbind/worker.h "the worker API header"
has zenflow-bind /usr/libexec/zenflow-bind/zenflow-optimizer "the optimizer worker"
has zenflow-bind-slurm /usr/lib64/slurm/zenflow_bind.so "the plugin in the RPM Slurm's plugin dir"
has zenflow-bind-slurm /usr/lib64/zenflow-bind/zenflow_bind_binder.so "the binder"
has python3-zenflow-bind "/usr/lib/python$py/site-packages/zenflow_bind/__init__.py" "the Python package"
flags=$(rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' "$(rpm_of zenflow-bind-slurm)" 2>/dev/null |
  grep '/etc/slurm/plugstack.conf.d/zenflow-bind.conf' || true)
case "$flags" in *" cn") echo "ok   the snippet is %config(noreplace)" ;;
*) echo "FAIL the snippet is not %config(noreplace): '$flags'"; fail=1 ;; esac
# %preun refuses an erase while plugstack.conf loads the plugin as required (the Debian prerm)
if grep -q "loads the plugin as required" <<<"$(rpm -qp --scripts "$(rpm_of zenflow-bind-slurm)" 2>/dev/null)"; then
  echo "ok   zenflow-bind-slurm's %preun guards plugstack.conf"
else echo "FAIL zenflow-bind-slurm has no %preun guarding plugstack.conf"; fail=1; fi
requires=$(rpm -qp --requires "$(rpm_of zenflow-bind-slurm)" 2>/dev/null)
for r in "slurm >= " "slurm < " "libzenbind = "; do
  if grep -q "^$r" <<<"$requires"; then echo "ok   zenflow-bind-slurm requires $r..."
  else echo "FAIL zenflow-bind-slurm does not require $r...: $(tr '\n' ' ' <<<"$requires")"; fail=1; fi
done
if grep -q "libzenbind\|libhwloc" <<<"$(rpm -qp --requires "$(rpm_of libzenbind)" 2>/dev/null)"; then
  echo "ok   libzenbind's requirements come from its ELF dependencies"
else echo "FAIL libzenbind requires no hwloc"; fail=1; fi
exit $fail
