#!/usr/bin/env bash
# Installs every build and test dependency of zenflow-bind from Debian's archive.
# Idempotent: packages already present are skipped, so a second run costs a few seconds.
set -euo pipefail

# Names that differ between Debian releases: the sanitizer runtime of the release's clang, and
# qemu-user-static (only a transitional name from trixie on, with no candidate: qemu-user).
# Read from apt's lists, fetched first where there are none (a fresh container).
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
release_names() {
  clang_major=$( (apt-cache depends clang 2>/dev/null || true) |
    sed -n 's/^ *Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -1)
  qemu_user=qemu-user-static
  if (apt-cache policy qemu-user-static 2>/dev/null || true) | grep -q 'Candidate: (none)'; then
    qemu_user=qemu-user
  fi
}
release_names
if [ -z "$clang_major" ]; then
  $SUDO apt-get update -qq
  release_names
fi

pkgs=(
  cmake g++ make pkg-config clang clang-format "libclang-rt-${clang_major:-14}-dev"  # toolchain, fuzzers, sanitizers
  libhwloc-dev hwloc libnuma-dev numactl                            # topology, memory placement
  libcmocka-dev                                                     # unit tests
  libslurm-dev slurmctld slurmd slurm-client                        # spank.h and the test cluster
  python3 python3-numpy python3-torch                               # the Python binding and its tests
  python3-matplotlib                                                # the demo's picture
  procps util-linux dpkg-dev file lintian rpm                        # ps, taskset, prlimit; packages
  debootstrap qemu-system-x86 e2fsprogs                             # the Debian roots and their VMs (tests/roots)
  g++-aarch64-linux-gnu "$qemu_user"                                # the arm64 cross build, run under qemu-user
  libhwloc-dev:arm64 libnuma-dev:arm64 libcmocka-dev:arm64          # its libraries (multiarch)
  libgomp1:arm64 libstdc++6:arm64
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
# The Slurm daemons are started by our own test fixture, never by the package scripts.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && made_policy=1
fi
trap '[ $made_policy -eq 1 ] && $SUDO rm -f "$policy"' EXIT
# The arm64 packages come from the same archive once dpkg knows the architecture.
dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
