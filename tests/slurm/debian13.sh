#!/usr/bin/env bash
# The real-srun suite against Debian 13's Slurm 24.11, in a Debian 13 root the project makes itself.
#
#   debian13.sh root              build the root if it is not cached yet; print its directory
#   debian13.sh test [CTEST ARGS] build the plugin inside the root against Slurm 24.11 and run
#                                 tests/slurm (every test_*.py, both TaskPlugin settings) in it
#   debian13.sh vm                boot the root under qemu with cgroup v2 (vm-init.sh): the real
#                                 cpuset and memory cgroup tests, cgroup2_binding.py on cgroup/v2
#
# The root: `debootstrap trixie` with Slurm and the build dependencies, kept read-only under
# $ZB_DEBIAN13_CACHE (default /var/cache/zenflow-bind) in a directory named for a hash of this
# script's package list, so one machine builds it once. Each run works on an overlay of it under
# $ZB_DEBIAN13_WORK (default build/debian13 of the source tree): the source tree is bind-mounted
# at its own path, with /proc, /sys (and the host's cgroup mounts under it) and /dev; the build
# goes to $ZB_DEBIAN13_WORK/build. On exit, even on failure, every process whose root is the
# overlay is killed and every mount undone.
#
# Needs root, debootstrap (scripts/install-deps.sh) and a Debian mirror: the one of
# /etc/apt/sources.list*, or $ZB_DEBIAN_MIRROR. Without root or debootstrap it exits 77, which any
# non-empty CI turns into a failure unless ZB_ALLOW_SKIP=1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
cache=${ZB_DEBIAN13_CACHE:-/var/cache/zenflow-bind}
work=${ZB_DEBIAN13_WORK:-$src/build/debian13}
suite=trixie

# What the root holds: Slurm 24.11 (daemons, srun, spank.h), the build dependencies of the plugin
# and of what tests/slurm runs (libzenbind, the optimizer worker, the Python example with torch);
# the same root boots as a small VM for cgroup v2.
packages=(
    slurmctld slurmd slurm-client libslurm-dev
    cmake g++ make pkg-config libhwloc-dev hwloc libnuma-dev libcmocka-dev
    python3 python3-numpy python3-torch procps util-linux
    linux-image-amd64 # the kernel and initramfs of the cgroup v2 VM (cgroup2-vm.sh)
)
key=$(printf '%s\n' "$suite" "${packages[@]}" | sha256sum | cut -c1-12)
root_dir=$cache/debian13-$key

log() { echo "debian13.sh: $*" >&2; }

skip() {
    if [ -n "${CI:-}" ] && [ "${ZB_ALLOW_SKIP:-}" != 1 ]; then
        log "FAIL: CI=$CI and the Debian 13 root cannot be made: $* (ZB_ALLOW_SKIP=1 accepts the skip)"
        exit 1
    fi
    echo "SKIP: $*" >&2
    exit 77
}

# The Debian archive this machine installs from (deb822 URIs: or one-line deb entries).
mirror() {
    local m
    if [ -n "${ZB_DEBIAN_MIRROR:-}" ]; then
        echo "$ZB_DEBIAN_MIRROR"
        return
    fi
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -oE '(https?|file)://[^ ]*/debian/?( |$)' | head -1 | tr -d ' ') || true
    echo "${m:-http://deb.debian.org/debian}"
}

# apt inside the new root, daemons kept from starting (policy-rc.d), /proc mounted meanwhile.
install_packages() {
    local root=$1 rc=0
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    mount -t proc proc "$root/proc"
    chroot "$root" apt-get update -qq &&
        chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${packages[@]}" &&
        chroot "$root" apt-get clean || rc=$?
    umount "$root/proc"
    return $rc
}

# Builds the root once per package list, under a lock: concurrent runs wait and share it.
ensure_root() {
    mkdir -p "$cache"
    exec 9>"$cache/debian13.lock"
    flock 9
    if [ ! -f "$root_dir/.complete" ]; then
        local tmp=$root_dir.tmp m
        m=$(mirror)
        rm -rf "$tmp"
        log "building the Debian 13 root in $root_dir from $m (a few minutes, once)"
        # debootstrap's own dependency resolution misses virtual packages: the base system
        # first, then apt inside it for the rest.
        if ! debootstrap --variant=minbase "$suite" "$tmp" "$m" >"$cache/debootstrap.log" 2>&1 ||
            ! install_packages "$tmp" >>"$cache/debootstrap.log" 2>&1; then
            tail -n 20 "$cache/debootstrap.log" >&2
            umount "$tmp/proc" 2>/dev/null || true
            rm -rf "$tmp"
            exit 1
        fi
        rm -rf "$root_dir"
        mv "$tmp" "$root_dir"
        touch "$root_dir/.complete"
    fi
    flock -u 9
}

merged=$work/root
mounted=()

# Kills what runs inside the overlay (the cluster's daemons, a stray step) and undoes the mounts,
# newest first.
cleanup() {
    local pid i
    set +e # a trap: every step runs whatever the one before it did
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$merged" ] && kill -KILL "$pid" 2>/dev/null
    done
    sleep 0.5
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" ||
            log "cannot unmount ${mounted[i]}"
    done
    mounted=()
    # The overlay's writes (a copy of the sources for the VM, the cluster's files): the build
    # in $work/build stays for the next run.
    mountpoint -q "$merged" || rm -rf "$work/upper" "$work/ovl" "$work/vm.img"
}

mount_root() {
    if mountpoint -q "$merged"; then
        log "$merged is mounted already: another run uses $work"
        exit 1
    fi
    rm -rf "$work/upper" "$work/ovl"
    mkdir -p "$work/upper" "$work/ovl" "$merged" "$work/build"
    work=$(cd "$work" && pwd)
    merged=$work/root
    trap cleanup EXIT
    mount -t overlay overlay -o "lowerdir=$root_dir,upperdir=$work/upper,workdir=$work/ovl" "$merged"
    mounted+=("$merged")
    local d
    for d in proc sys dev; do
        mkdir -p "$merged/$d"
    done
    mount -t proc proc "$merged/proc"
    mounted+=("$merged/proc")
    # rbind: the host's cgroup mounts under /sys/fs/cgroup and /dev/pts, /dev/shm come along;
    # rslave: unmounting them here never reaches the host's.
    mount --rbind /sys "$merged/sys" && mount --make-rslave "$merged/sys"
    mounted+=("$merged/sys")
    mount --rbind /dev "$merged/dev" && mount --make-rslave "$merged/dev"
    mounted+=("$merged/dev")
    local dir
    for dir in "$src" "$work"; do
        [ "$dir" = "$work" ] && [[ $work/ == "$src"/* ]] && continue # already there with $src
        mkdir -p "$merged$dir"
        mount --bind "$dir" "$merged$dir"
        mounted+=("$merged$dir")
    done
    cp /etc/hosts "$merged/etc/hosts"
    cp /etc/resolv.conf "$merged/etc/resolv.conf" 2>/dev/null || true
    hostname >"$merged/etc/hostname"
}

in_root() {
    chroot "$merged" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        ${CI:+CI="$CI"} ${ZB_ALLOW_SKIP:+ZB_ALLOW_SKIP="$ZB_ALLOW_SKIP"} "$@"
}

# Configures the project inside the root against Slurm 24.11 and builds these targets.
build_in_root() {
    log "Slurm in the root: $(in_root dpkg-query -W -f='${Version}' slurmd)"
    in_root cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZB_WERROR=ON \
        >"$work/configure.log" || { cat "$work/configure.log" >&2; exit 1; }
    grep 'targets Slurm' "$work/configure.log" >&2
    in_root nice -n 5 cmake --build "$work/build" -j2 --target "$@"
}

# What tests/slurm runs: the plugin, its binder, libzenbind and the optimizer worker.
slurm_targets=(zenflow_bind zenflow_bind_binder zenbind zenflow-optimizer)

run_tests() {
    mount_root
    build_in_root "${slurm_targets[@]}"
    in_root ctest --test-dir "$work/build" -L '^slurm$' --output-on-failure "$@"
}

# The root booted as a VM under qemu (TCG, or $ZB_VM_ACCEL) with its own kernel:
# cgroup v2 alone, no systemd. vm-init.sh runs the tests there from a copy of the sources and of
# the build made in the root, on an ext4 image of the overlay.
run_vm() {
    command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86 is not installed (scripts/install-deps.sh)"
    mount_root
    build_in_root "${slurm_targets[@]}" test_cgroup_real test_worker_memcg
    local i kernel initrd img=$work/vm.img console=$work/vm-console.log size
    for ((i = ${#mounted[@]} - 1; i > 0; i--)); do umount -R "${mounted[i]}"; done
    mounted=("$merged")
    mkdir -p "$merged$src" "$merged$work/build"
    tar -C "$src" --exclude=./build -cf - . | tar -C "$merged$src" -xf -
    cp -a "$work/build/." "$merged$work/build/"
    install -m 755 "$here/vm-init.sh" "$merged/zb-vm-init"
    printf 'SRC=%q\nBUILD=%q\nCI=%q\nZB_ALLOW_SKIP=%q\n' "$src" "$work/build" "${CI:-}" \
        "${ZB_ALLOW_SKIP:-}" >"$merged/zb-vm.env"
    kernel=$(ls "$merged"/boot/vmlinuz-* | tail -1)
    initrd=$(ls "$merged"/boot/initrd.img-* | tail -1)
    size=$(($(du -sxm "$merged" | cut -f1) * 5 / 4 + 512))
    rm -f "$img"
    mke2fs -q -F -t ext4 -L zbroot -d "$merged" "$img" "${size}M"
    log "booting $(basename "$kernel") on a ${size} MiB image ($console)"
    # TCG by default: this project's machines have a /dev/kvm whose nested KVM stops the guest
    # kernel at its first instructions ("KVM internal error ... emulation failure"), whatever the
    # -cpu model. ZB_VM_ACCEL=kvm where KVM works.
    timeout 1500 qemu-system-x86_64 -accel "${ZB_VM_ACCEL:-tcg}" -cpu max -smp 4 -m 3072 \
        -nographic -no-reboot -nic none -kernel "$kernel" -initrd "$initrd" \
        -append "root=/dev/vda rw init=/zb-vm-init console=ttyS0 panic=-1 quiet" \
        -device virtio-rng-pci -drive "file=$img,if=virtio,format=raw" </dev/null >"$console" 2>&1 || true
    rm -f "$img"
    grep -E '^(====|ZB-VM-RESULT)|SKIP|FAIL|OK|Error|error' "$console" | tail -n 60 >&2
    grep -q '^ZB-VM-RESULT 0' "$console" || { log "the VM's tests failed (or it did not finish): $console"; exit 1; }
}

verb=${1:-}
[ $# -gt 0 ] && shift
case $verb in
root | test | vm) ;;
*)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (scripts/install-deps.sh)"
ensure_root
case $verb in
root) echo "$root_dir" ;;
test) run_tests "$@" ;;
vm) run_vm ;;
esac
