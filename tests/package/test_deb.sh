#!/usr/bin/env bash
# Builds the Debian package of this build tree with cpack, unpacks it into a scratch root and
# checks its layout and metadata.   usage: test_deb.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/out/*.deb)
root="$work/root"
dpkg-deb -x "$deb" "$root"

fail=0
expect() { # expect PATH-GLOB DESCRIPTION
  if compgen -G "$root/$1" >/dev/null; then echo "ok   $2 ($1)"; else echo "FAIL $2: nothing at /$1"; fail=1; fi
}
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
expect "usr/lib/$multiarch/libzenbind.so.0" "library with its soname"
expect "usr/lib/$multiarch/pkgconfig/zenbind.pc" "pkg-config file"
expect "usr/lib/$multiarch/cmake/zenbind/zenbindConfig.cmake" "CMake package"
expect "usr/include/zenbind/zenbind.h" "C header"
expect "usr/include/zenbind/worker.h" "worker API header"
expect "usr/bin/zenbind" "zenbind CLI"
expect "usr/bin/zenflow-bench" "benchmark tool"
expect "usr/libexec/zenflow-bind/zenflow-optimizer" "optimizer worker"
expect "usr/lib/$multiarch/slurm-wlm/zenflow_bind.so" "SPANK plugin in Slurm's PluginDir"
expect "usr/lib/$multiarch/zenflow-bind/zenflow_bind_binder.so" "the plugin's binder, loaded per binding step"
# Every srun, sbatch, salloc and slurmstepd loads the plugin: it may need the C library (and the
# dynamic loader) and nothing else; libzenbind and hwloc come with the binder, per binding step.
plugin_so="$root/usr/lib/$multiarch/slurm-wlm/zenflow_bind.so"
if [ -f "$plugin_so" ]; then
  extra=$(readelf -d "$plugin_so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
    grep -vxE 'libc\.so\.6|libm\.so\.6|ld-linux-x86-64\.so\.2' | tr '\n' ' ' || true)
  if [ -z "$extra" ]; then echo "ok   the plugin needs only the C library"
  else echo "FAIL the plugin loads more than the C library: $extra"; fail=1; fi
fi
expect "usr/lib/python3/dist-packages/zenflow_bind/__init__.py" "Python package where python3 imports it"
for page in man1/zenbind.1 man1/zenflow-bench.1 man1/zenflow-optimizer.1 man3/libzenbind.3 man8/zenflow_bind.8; do
  expect "usr/share/man/$page*" "man page $page"
done
snippet="$root/etc/slurm/plugstack.conf.d/zenflow-bind.conf"
expect "etc/slurm/plugstack.conf.d/zenflow-bind.conf" "plugstack.conf.d snippet"
if [ -f "$snippet" ] && grep -qE '^[[:space:]]*(required|optional)' "$snippet"; then
  echo "FAIL the plugstack.conf.d snippet is enabled; it must be installed disabled"; fail=1
fi

# No build-tree paths may leak into installed binaries.
while IFS= read -r f; do
  if readelf -d "$f" 2>/dev/null | grep -E 'R(UN)?PATH' | grep -q "$build"; then
    echo "FAIL $f has a RUNPATH into the build tree"; fail=1
  fi
done < <(find "$root" -type f \( -name '*.so*' -o -perm -u+x \))

depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
case "$depends" in *libhwloc*) ;; *) echo "FAIL Depends lacks libhwloc"; fail=1 ;; esac
case "$depends" in *"slurm-client (>= "*) ;; *) echo "FAIL Depends does not pin slurm-client"; fail=1 ;; esac
exit $fail
