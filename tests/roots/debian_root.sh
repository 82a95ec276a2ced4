#!/usr/bin/env bash
# The project's tests against other Debian releases, each in a Debian root the project makes itself:
#
#   debian_root.sh RELEASE root          build the root if it is not cached yet; print its path
#   debian_root.sh RELEASE slurm [ARGS]  build the plugin inside the root against the release's
#                                        Slurm and run tests/slurm there (every test_*.py, both
#                                        TaskPlugin settings); ARGS go to ctest
#   debian_root.sh RELEASE python [ARGS] build the project inside the root and run the Python
#                                        suite there, against the release's torch; then install
#                                        it under /usr (in the overlay) and run the torch 2.x
#                                        tests again with the package as a user gets it
#   debian_root.sh RELEASE compilers     build every target with each compiler of the release (GCC;
#                                        clang too on forky), warnings as errors
#   debian_root.sh RELEASE vm            boot the root under qemu with cgroup v2 (vm-init.sh): the
#                                        real cpuset and memory cgroup tests, cgroup2_binding.py
#   debian_root.sh RELEASE demo [OUT]    build the plugin, libzenbind, the worker and the C demo
#                                        in the root and run contrib/demo/srun_runs.sh there, its
#                                        logs to OUT (default build/demo; scripts/demo.sh)
#   debian_root.sh RELEASE shell [CMD]   run CMD (default bash) in the mounted root, by hand
#
# RELEASE is trixie (Debian 13: Slurm 24.11, torch 2.6, GCC 14) or forky (Debian 14 while in
# testing: Slurm 26.05, torch 2.14, GCC 16, transformers 5).
#
# The root: `debootstrap RELEASE` with Slurm and the build and test dependencies, kept read-only
# under $ZB_ROOT_CACHE (default /var/cache/zenflow-bind) in a directory named for the release and a
# hash of its package list, so one machine builds it once, under a lock that concurrent runs wait
# on. Each run works on an overlay of it under $ZB_ROOT_WORK (default build/RELEASE of the source
# tree), one run at a time: the source tree is bind-mounted at its own path, with /proc, /sys (and
# the host's cgroup mounts under it) and /dev; the build goes to $ZB_ROOT_WORK/build. On exit, even
# on failure, every process whose root is the overlay is killed and every mount undone.
#
# Needs root, debootstrap (scripts/install-deps.sh) and a Debian mirror: the one of
# /etc/apt/sources.list*, or $ZB_DEBIAN_MIRROR. Without root or debootstrap it exits 77, which any
# non-empty CI turns into a failure unless ZB_ALLOW_SKIP=1.
set -euo pipefail
# All of it in one { } that bash reads whole before running any of it: a run goes on unharmed when
# this file is edited meanwhile (ctest runs it for half an hour).
{
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
release=${1:-}
verb=${2:-}
usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
[ $# -ge 2 ] || usage
shift 2

# What every root holds: Slurm (daemons, srun, spank.h), the build dependencies of the plugin and
# of what tests/slurm and tests/python run (libzenbind, the optimizer worker, torch); the same root
# boots as a small VM for cgroup v2.
packages=(
    slurmctld slurmd slurm-client libslurm-dev
    cmake g++ make pkg-config libhwloc-dev hwloc libnuma-dev libcmocka-dev
    python3 python3-numpy python3-torch procps util-linux
    # The kernel and initramfs of the cgroup v2 VM (vm-init.sh). initramfs-tools, not forky's
    # default dracut: dracut run in a chroot leaves ext4 out of the initramfs, and the VM's kernel
    # then cannot mount its disk.
    linux-image-amd64 initramfs-tools
)
# What differs per release: debootstrap's script for it, apt's options inside it, more packages,
# the compilers that the compilers verb builds with.
apt_opts=()
compilers=(gcc)
case $release in
trixie)
    script= # debootstrap's own
    ;;
forky)
    # Debian 12's debootstrap has no forky script: sid's makes testing the same way. The mirror's
    # testing Release file may be past its Valid-Until (it is renewed only when testing moves).
    script=/usr/share/debootstrap/scripts/sid
    apt_opts=(-o Acquire::Check-Valid-Until=false)
    # HF Trainer for the torch 2.x tests (Trainer needs accelerate); clang and its OpenMP to
    # check that forky's compilers build the project clean. OpenBLAS, which a Debian user's torch
    # runs its matrix products on: without it libblas.so.3 is the reference BLAS, and the demo's
    # GPT-2 trained at 6 GFLOP/s on 2 Zen 4 cores. Its OpenMP build, which shares torch's threads:
    # the pthreads one ran its own beside them, 5x slower on 2 cores.
    packages+=(python3-transformers python3-accelerate clang libomp-dev libopenblas0-openmp)
    compilers+=(clang)
    ;;
*) usage ;;
esac
case $verb in
root | slurm | python | compilers | vm | demo | shell) ;;
*) usage ;;
esac

cache=${ZB_ROOT_CACHE:-/var/cache/zenflow-bind}
work=${ZB_ROOT_WORK:-$src/build/$release}
key=$(printf '%s\n' "$release" "$script" "${packages[@]}" | sha256sum | cut -c1-12)
root_dir=$cache/$release-$key

log() { echo "debian_root.sh $release: $*" >&2; }

. "$here/../skip.sh"

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

# /proc, /sys and /dev of the host inside a root (torch's and the kernel's maintainer scripts
# read them); rslave: unmounting them there never reaches the host's.
mount_system() {
    local root=$1
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
    mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
}

umount_system() {
    local root=$1 d
    for d in dev sys proc; do
        mountpoint -q "$root/$d" && { umount -R "$root/$d" || umount -R -l "$root/$d"; }
    done
    return 0
}

# apt inside the new root, daemons kept from starting (policy-rc.d), documentation left out.
install_packages() {
    local root=$1 rc=0
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
        'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
        >"$root/etc/dpkg/dpkg.cfg.d/zenflow-bind-nodoc"
    mount_system "$root"
    chroot "$root" apt-get "${apt_opts[@]}" update -qq &&
        chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
            --no-install-recommends "${packages[@]}" &&
        chroot "$root" apt-get clean || rc=$?
    umount_system "$root"
    return $rc
}

# One line every 30 s while the root is made: time so far, its size, what apt or debootstrap does.
progress() {
    local dir=$1 logfile=$2 start=$3 parent=$4 last size
    while sleep 30 && kill -0 "$parent" 2>/dev/null; do
        last=$(grep -aE '^(I: |Get:|Unpacking|Setting up)' "$logfile" 2>/dev/null | tail -n 1)
        size=$(du -sxm "$dir" 2>/dev/null | cut -f1)
        log "$(($(date +%s) - start)) s, ${size:-0} MiB: ${last:0:80}"
    done
}

# Builds the root once per package list, under a lock: concurrent runs wait and share it.
ensure_root() {
    mkdir -p "$cache"
    exec 9>"$cache/$release.lock"
    flock 9
    if [ ! -f "$root_dir/.complete" ]; then
        local tmp=$root_dir.tmp m start=$SECONDS logfile=$cache/$release-build.log ticker rc=0
        m=$(mirror)
        [ -d "$tmp" ] && umount_system "$tmp"
        rm -rf "$tmp"
        log "building the root in $root_dir from $m, ${#packages[@]} packages and their" \
            "dependencies (once per machine; about 5 to 15 min, a line every 30 s; log: $logfile)"
        progress "$tmp" "$logfile" "$(date +%s)" $$ &
        ticker=$!
        # Killed half-way (a ctest timeout): no mount of the host's /sys or /dev left behind.
        trap 'kill $ticker 2>/dev/null; umount_system "$tmp"' EXIT
        # debootstrap's own dependency resolution misses virtual packages: the base system
        # first, then apt inside it for the rest.
        {
            debootstrap --variant=minbase "$release" "$tmp" "$m" ${script:+"$script"} &&
                install_packages "$tmp"
        } >"$logfile" 2>&1 || rc=$?
        kill "$ticker" 2>/dev/null
        wait "$ticker" 2>/dev/null || true
        trap - EXIT
        if [ $rc -ne 0 ]; then
            tail -n 20 "$logfile" >&2
            umount_system "$tmp"
            rm -rf "$tmp"
            log "FAIL: the root could not be made (exit $rc): $logfile"
            exit 1
        fi
        rm -rf "$root_dir"
        mv "$tmp" "$root_dir"
        touch "$root_dir/.complete"
        log "built in $((SECONDS - start)) s: $(du -sxh "$root_dir" | cut -f1) in $root_dir"
        # The roots of this release's former package lists, unless a run still has one mounted.
        local old
        for old in "$cache/$release"-*/; do
            old=${old%/}
            [ "$old" = "$root_dir" ] || grep -qF "lowerdir=$old," /proc/mounts ||
                { log "removing $old (a former package list)"; rm -rf "$old"; }
        done
    else
        log "cached in $root_dir"
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

# One run per work directory at a time (ctest in two build trees, a hand run): the next waits.
mount_root() {
    mkdir -p "$work"
    work=$(cd "$work" && pwd)
    merged=$work/root
    exec 8>"$work/.lock"
    if ! flock -n 8; then
        log "waiting for the run that holds $work/.lock"
        flock 8
    fi
    mountpoint -q "$merged" && umount -R -l "$merged" # left by a run that was killed
    rm -rf "$work/upper" "$work/ovl"
    mkdir -p "$work/upper" "$work/ovl" "$merged" "$work/build"
    trap cleanup EXIT
    mount -t overlay overlay -o "lowerdir=$root_dir,upperdir=$work/upper,workdir=$work/ovl" "$merged"
    mounted+=("$merged")
    local d dir
    for d in proc sys dev; do
        mkdir -p "$merged/$d"
    done
    # /sys and /dev by rbind: the host's cgroup mounts, /dev/pts and /dev/shm come along.
    mount_system "$merged"
    mounted+=("$merged/proc" "$merged/sys" "$merged/dev")
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
        ${TERM:+TERM="$TERM"} ${CI:+CI="$CI"} ${ZB_ALLOW_SKIP:+ZB_ALLOW_SKIP="$ZB_ALLOW_SKIP"} "$@"
}

# Configures the project in DIR inside the root against its Slurm, with the compiler CXX (c++ or
# clang++, and the matching C compiler), warnings as errors, and builds these targets.
build_in_root() {
    local dir=$1 cxx=$2 cc=cc
    shift 2
    [ "$cxx" = clang++ ] && cc=clang
    log "in the root: Slurm $(in_root dpkg-query -W -f='${Version}' slurmd)," \
        "$(in_root "$cxx" --version | head -1)," \
        "torch $(in_root dpkg-query -W -f='${Version}' python3-torch)"
    in_root cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZB_WERROR=ON \
        -DCMAKE_INSTALL_PREFIX=/usr \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >"$dir.configure.log" ||
        { cat "$dir.configure.log" >&2; exit 1; }
    grep 'targets Slurm' "$dir.configure.log" >&2 || true
    in_root nice -n 5 cmake --build "$dir" -j2 --target "$@"
}

# What tests/slurm runs: the plugin, its binder, libzenbind and the optimizer worker.
slurm_targets=(zenflow_bind zenflow_bind_binder zenbind zenflow-optimizer)

run_slurm() {
    mount_root
    build_in_root "$work/build" c++ "${slurm_targets[@]}"
    in_root ctest --test-dir "$work/build" -L '^slurm$' --output-on-failure "$@"
}

# The torch 2.x APIs again with the package as a user gets it: installed under /usr by the rules
# the Debian packages are made from (into the overlay, thrown away on exit), found by Debian's
# python3 with no PYTHONPATH into the package and no ZENFLOW_* variable; tests/python is on the
# path for its test helpers alone. FSDP2's test (a minute of gloo ranks) runs in the tree only:
# it goes through the same modules as the others.
installed_tests=(test_torch_dcp.py test_torch_failures.py test_hf_trainer.py
                 test_torch_in_process.py test_torch_bucket_steps.py test_torch_compile.py
                 test_torch_amp.py)

run_python() {
    mount_root
    build_in_root "$work/build" c++ all
    log "$(in_root python3 -c 'import sys, torch; print("Python", sys.version.split()[0],
                                                        "torch", torch.__version__)')"
    in_root ctest --test-dir "$work/build" -L '^python$' --output-on-failure "$@"
    local component t
    for component in lib tools python; do
        in_root cmake --install "$work/build" --component "$component" >/dev/null
    done
    in_root ldconfig
    in_root python3 "$src/tests/package/installed_step.py" /usr/lib/python3/dist-packages
    for t in "${installed_tests[@]}"; do
        log "installed package: $t"
        in_root env PYTHONPATH="$src/tests/python" python3 "$src/tests/python/$t"
    done
}

# The root booted as a VM under qemu (TCG, or $ZB_VM_ACCEL) with its own kernel:
# cgroup v2 alone, no systemd. vm-init.sh runs the tests there from a copy of the sources and of
# the build made in the root, on an ext4 image of the overlay.
run_vm() {
    command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86 is not installed (scripts/install-deps.sh)"
    mount_root
    build_in_root "$work/build" c++ "${slurm_targets[@]}" test_cgroup_real test_worker_memcg
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
    # TCG with one host thread for all vCPUs: with a thread per vCPU, a vCPU can run code another
    # has just patched (the kernel's int3 text patching of static keys) from a stale translation,
    # and the guest oopses on an int3 that is no longer there (forky at 2 s in sched_clock_cpu;
    # trixie in get_page_from_freelist during a test). An oops panics at once (panic_on_oops) and
    # a boot is given 600 s (the tests take 1 to 3 minutes): a guest that went wrong is booted
    # once more, and what goes wrong twice fails with the console's end printed.
    local accel=${ZB_VM_ACCEL:-tcg,thread=single} attempt
    for attempt in 1 2; do
        timeout 600 qemu-system-x86_64 -accel "$accel" -cpu max -smp 4 -m 3072 \
            -nographic -no-reboot -nic none -kernel "$kernel" -initrd "$initrd" \
            -append "root=/dev/vda rw init=/zb-vm-init console=ttyS0 panic=-1 panic_on_oops=1 quiet" \
            -device virtio-rng-pci -drive "file=$img,if=virtio,format=raw" </dev/null >"$console" 2>&1 || true
        grep -q '^ZB-VM-RESULT' "$console" && break
        cp "$console" "$console.failed$attempt"
        log "the guest did not finish (a panic, or 600 s): $console.failed$attempt"
        [ "$attempt" = 2 ] || log "booting again"
    done
    rm -f "$img"
    grep -E '^(====|ZB-VM-RESULT)|SKIP|FAIL|OK|Error|error' "$console" | tail -n 60 >&2
    grep -q '^ZB-VM-RESULT 0' "$console" && return
    log "the VM's tests failed (or it did not finish): $console ends with"
    tail -n 40 "$console" | cut -c1-200 >&2
    exit 1
}

# Every target with each compiler of the release, warnings as errors: what a newer GCC or clang
# flags shows here before a distribution's build does.
run_compilers() {
    mount_root
    local c
    for c in "${compilers[@]}"; do
        case $c in
        gcc) build_in_root "$work/build" c++ all ;;
        clang) build_in_root "$work/clang" clang++ all ;;
        esac
        log "$c: every target built with -Werror"
    done
}

run_demo() {
    local out=${1:-$src/build/demo}
    mount_root
    build_in_root "$work/build" c++ "${slurm_targets[@]}" zenflow-demo >/dev/null
    mkdir -p "$out"
    in_root ${ZB_DEMO_STEPS:+ZB_DEMO_STEPS="$ZB_DEMO_STEPS"} \
        ${ZB_DEMO_ARGS:+ZB_DEMO_ARGS="$ZB_DEMO_ARGS"} \
        ${GLIBC_TUNABLES+GLIBC_TUNABLES="$GLIBC_TUNABLES"} \
        bash "$src/contrib/demo/srun_runs.sh" "$work/build" "$(cd "$out" && pwd)"
}

run_shell() {
    mount_root
    in_root "${@:-bash}"
}

[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (scripts/install-deps.sh)"
ensure_root
case $verb in
root) echo "$root_dir" ;;
slurm) run_slurm "$@" ;;
python) run_python "$@" ;;
compilers) run_compilers ;;
demo) run_demo "$@" ;;
vm) run_vm ;;
shell) run_shell "$@" ;;
esac
exit
}
