#!/bin/bash
# PID 1 of debian_root.sh's VM (booted with init=/zb-vm-init): mounts what a system needs, cgroup
# v2 alone at /sys/fs/cgroup (no systemd), runs the cgroup v2 tests, prints "ZB-VM-RESULT RC" on
# the console and powers off. /zb-vm.env (written by debian_root.sh) says where the sources and the
# build are. Nothing here runs on the host.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -o remount,rw /
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# /tmp stays the image's own: a source tree checked out under /tmp (CI's clones, say) was copied
# there, and a tmpfs on top would hide it.
mount -t cgroup2 cgroup2 /sys/fs/cgroup
hostname zbvm
echo "127.0.0.1 localhost zbvm" >/etc/hosts
# Loopback up, and a dummy interface with an address: Slurm resolves its listening address with
# AI_ADDRCONFIG, which finds nothing on a machine with loopback alone. No iproute2 in the root:
# SIOCGIFFLAGS/SIOCSIFFLAGS and SIOCSIFADDR/SIOCSIFNETMASK from Python.
modprobe dummy numdummies=1
python3 -c '
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def ifreq(name, data=b""):
    return struct.pack("16s16s", name, data)
def addr(ip):
    return struct.pack("HH4s8s", socket.AF_INET, 0, socket.inet_aton(ip), b"")
for name, ip in ((b"lo", None), (b"dummy0", "10.254.0.1")):
    if ip:
        fcntl.ioctl(s, 0x8916, ifreq(name, addr(ip)))
        fcntl.ioctl(s, 0x891C, ifreq(name, addr("255.255.255.0")))
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifreq(name))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", name, flags | 1, b""))'
# As systemd would: the controllers Slurm and the tests use, available below the root.
echo "+cpuset +cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control

# shellcheck source=/dev/null
. /zb-vm.env # SRC, BUILD, and CI / ZB_ALLOW_SKIP when set on the host
export CI ZB_ALLOW_SKIP
rc=0
# What runs, every 2 minutes: a hung step shows where it waits.
(while sleep 120; do ps -eo pid,stat,etime,wchan:24,args --forest | cut -c1-160; done) &
monitor=$!
run() {
    echo "==== $*"
    "$@" || { echo "==== FAILED ($?): $*"; rc=1; logs; }
}
# The logs of the clusters a failed test left behind (a passing one removes its directory).
logs() {
    local f
    for f in /tmp/zb-slurm-*/log/*; do
        [ -f "$f" ] && echo "==== $f" && tail -n 30 "$f"
    done
    rm -rf /tmp/zb-slurm-*
}
echo "==== $(uname -r), cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers)," \
    "$(nproc) CPUs, Slurm $(dpkg-query -W -f='${Version}' slurmd)"
run "$BUILD/tests/unit/test_cgroup_real"
run env ZENFLOW_OPTIMIZER="$BUILD/optimizer/zenflow-optimizer" "$BUILD/tests/unit/test_worker_memcg"
# Slurm 26.05 names a job's cgroup v2 directory by its SLUID unless CgroupJobIdPaths=yes: both
# there. Before it, by job id alone (no such key: left unset).
job_id_paths=("")
dpkg --compare-versions "$(dpkg-query -W -f='${Version}' slurmd)" ge 26.05 && job_id_paths=(yes no)
for paths in "${job_id_paths[@]}"; do
    for constrain in yes no; do
        run env ZB_CONSTRAIN_CORES=$constrain ZB_CGROUP_JOB_ID_PATHS="$paths" \
            python3 "$SRC/tests/slurm/cgroup2_binding.py" "$BUILD/spank_plugin/zenflow_bind.so" \
            --task-plugin cgroup
    done
done
kill $monitor
echo "ZB-VM-RESULT $rc"
sync
echo o >/proc/sysrq-trigger
sleep 30
