#!/usr/bin/env bash
# Builds the Debian packages of this build tree with cpack, checks them with lintian, unpacks them
# into a scratch root and checks the layout and the metadata each package needs.
#   usage: test_deb.sh BUILD_DIR [OUT_DIR]   (OUT_DIR keeps the .debs, for test_apt.sh)
# A cross build's packages (the aarch64 preset) are checked the same way, for their architecture.
. "$(dirname "$0")/common.sh"
build=$1
out=${2:-$work/out}

(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; exit 1; }
root="$work/root"
fail=0
deb_of() { ls "$out"/"$1"_*.deb 2>/dev/null | head -1; }
for pkg in libzenbind$so libzenbind-dev zenflow-bind zenflow-bind-slurm python3-zenflow-bind; do
  deb=$(deb_of "$pkg")
  if [ -z "$deb" ]; then echo "FAIL no package $pkg"; fail=1; continue; fi
  dpkg-deb -x "$deb" "$root"
  contents=$(dpkg-deb -c "$deb")
  for f in copyright changelog.gz; do
    grep -q "usr/share/doc/$pkg/$f$" <<<"$contents" || { echo "FAIL $pkg has no $f"; fail=1; }
  done
done

expect() { # expect PATH-GLOB DESCRIPTION
  if compgen -G "$root/$1" >/dev/null; then echo "ok   $2 ($1)"; else echo "FAIL $2: nothing at /$1"; fail=1; fi
}
# The architecture the packages are for, and what their programs must be built for.
arch=$(dpkg-deb -f "$(deb_of libzenbind$so)" Architecture)
multiarch=$(dpkg-architecture -a "$arch" -qDEB_HOST_MULTIARCH 2>/dev/null)
case $arch in
  amd64) machine="Advanced Micro Devices X86-64" loader='ld-linux-x86-64\.so\.2' ;;
  arm64) machine="AArch64" loader='ld-linux-aarch64\.so\.1' ;;
  *) echo "FAIL packages for $arch, which this test does not know"; exit 1 ;;
esac
echo "ok   packages for $arch ($multiarch)"
for pkg in libzenbind$so libzenbind-dev zenflow-bind zenflow-bind-slurm; do
  [ "$(dpkg-deb -f "$(deb_of "$pkg")" Architecture)" = "$arch" ] ||
    { echo "FAIL $pkg is not for $arch"; fail=1; }
done
while IFS= read -r f; do
  got=$(readelf -h "$f" 2>/dev/null | sed -n 's/^ *Machine: *//p')
  [ -z "$got" ] || [ "$got" = "$machine" ] || { echo "FAIL ${f#"$root"} is for $got, not $arch"; fail=1; }
done < <(find "$root" -type f \( -name '*.so*' -o -perm -u+x \))
expect "usr/lib/$multiarch/libzenbind.so.$so" "library with its soname"
expect "usr/lib/$multiarch/pkgconfig/zenbind.pc" "pkg-config file"
expect "usr/lib/$multiarch/cmake/zenbind/zenbindConfig.cmake" "CMake package"
expect "usr/include/zenbind/zenbind.h" "C header"
expect "usr/include/zenbind/worker.h" "worker API header"
expect "usr/include/zenbind/adam.h" "in-process Adam header"
expect "usr/lib/python3/dist-packages/zenflow_bind/functional.py" "Python functional Adam"
expect "usr/bin/zenbind" "zenbind CLI"
expect "usr/bin/zenflow-bench" "benchmark tool"
expect "usr/libexec/zenflow-bind/zenflow-optimizer" "optimizer worker"
expect "usr/lib/$multiarch/slurm-wlm/zenflow_bind.so" "SPANK plugin in Slurm's PluginDir"
expect "usr/lib/$multiarch/zenflow-bind/zenflow_bind_binder.so" "the plugin's binder, loaded per binding step"
expect "usr/lib/python3/dist-packages/zenflow_bind/__init__.py" "Python package where python3 imports it"
for page in man1/zenbind.1 man1/zenflow-bench.1 man1/zenflow-optimizer.1 man3/libzenbind.3 man8/zenflow_bind.8 \
            man3/zenflow_bind.optim.3 man3/zenflow_bind.deepspeed.3 man3/zenflow_bind.3; do
  expect "usr/share/man/$page.gz" "man page $page, compressed"
  # the footer names the packages' version, which the build writes in
  footer=$(zcat "$root/usr/share/man/$page.gz" 2>/dev/null | sed -n '/^\.TH /p') # (reads all)
  version=$(dpkg-deb -f "$(deb_of zenflow-bind)" Version)
  case $footer in *"\"zenflow-bind $version\""*) ;;
  *) echo "FAIL $page's footer is not version $version: $footer"; fail=1 ;; esac
done
# libzenbind(3) and its aliases come with -dev: no dangling link
for alias in "$root"/usr/share/man/man3/zb_*.3.gz; do
  [ -e "$alias" ] || { echo "FAIL ${alias#"$root"} leads nowhere"; fail=1; }
done
snippet="$root/etc/slurm/plugstack.conf.d/zenflow-bind.conf"
expect "etc/slurm/plugstack.conf.d/zenflow-bind.conf" "plugstack.conf.d snippet"
if [ -f "$snippet" ] && grep -qE '^[[:space:]]*(required|optional)' "$snippet"; then
  echo "FAIL the plugstack.conf.d snippet is enabled; it must be installed disabled"; fail=1
fi
# Uncommenting a line of the snippet must load this package's plugin: its path is where the
# package puts it (the multiarch directory of the packages' architecture).
if [ -f "$snippet" ]; then
  paths=$(sed -n 's/^#\(required\|optional\)[[:space:]]\+\([^[:space:]]*\).*/\2/p' "$snippet" | sort -u)
  [ -n "$paths" ] || { echo "FAIL the snippet names no plugin"; fail=1; }
  for p in $paths; do
    if [ -f "$root$p" ]; then echo "ok   the snippet loads $p"
    else echo "FAIL the snippet loads $p, which the package does not hold"; fail=1; fi
  done
fi
conffiles=$(dpkg-deb -I "$(deb_of zenflow-bind-slurm)" conffiles 2>/dev/null || true)
if ! grep -qx "/etc/slurm/plugstack.conf.d/zenflow-bind.conf" <<<"$conffiles"; then
  echo "FAIL the snippet is not a conffile: an upgrade would undo the admin's edit"; fail=1
fi

# Every srun, sbatch, salloc and slurmstepd loads the plugin: it may need the C library (and the
# dynamic loader) and nothing else; libzenbind and hwloc come with the binder, per binding step.
plugin_so="$root/usr/lib/$multiarch/slurm-wlm/zenflow_bind.so"
if [ -f "$plugin_so" ]; then
  extra=$(readelf -d "$plugin_so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
    grep -vxE "libc\\.so\\.6|libm\\.so\\.6|$loader" | tr '\n' ' ' || true)
  if [ -z "$extra" ]; then echo "ok   the plugin needs only the C library"
  else echo "FAIL the plugin loads more than the C library: $extra"; fail=1; fi
fi

# No build-tree paths, and no RUNPATH at all (lintian: custom-library-search-path).
while IFS= read -r f; do
  # Not piped into grep -q: under pipefail an early quit could hide the very line it found.
  if grep -qE 'R(UN)?PATH' <<<"$(readelf -d "$f" 2>/dev/null)"; then
    echo "FAIL $f has a RUNPATH"; fail=1
  fi
done < <(find "$root" -type f \( -name '*.so*' -o -perm -u+x \))

depends() { dpkg-deb -f "$(deb_of "$1")" "${field:-Depends}"; }
need() { # need PACKAGE TEXT WHY   (field=Pre-Depends need ...: that field)
  case "$(depends "$1")" in *"$2"*) echo "ok   $1 ${field:-Depends}: $2" ;;
  *) echo "FAIL $1 ${field:-Depends} lacks $2 ($3): $(depends "$1")"; fail=1 ;; esac
}
need libzenbind$so libhwloc "the library links hwloc"
# Checked by dpkg before it unpacks (test_apt.sh installs a build for another release)
field=Pre-Depends need zenflow-bind-slurm "slurm-wlm-basic-plugins (>= " \
  "srun and slurmstepd load only plugins of their release"
need zenflow-bind-slurm "libzenbind$so (=" "the binder links libzenbind"
need python3-zenflow-bind "zenflow-bind (=" "the Python package starts zenflow-optimizer"
need libzenbind-dev "pkgconf" "find_package(zenbind) finds hwloc with pkg-config"
case "$(depends zenflow-bind-slurm)" in *slurm-client*)
  echo "FAIL zenflow-bind-slurm depends on slurm-client, which compute nodes lack"; fail=1 ;; esac

if command -v lintian >/dev/null; then
  report=$(lintian "$out"/*.deb 2>/dev/null || true)
  if grep -E '^E: ' <<<"$report"; then
    echo "FAIL lintian reports errors"; fail=1
  else
    echo "ok   lintian: no errors"
  fi
else
  echo "FAIL lintian is not installed (scripts/install-deps.sh installs it)"; fail=1
fi
exit $fail
