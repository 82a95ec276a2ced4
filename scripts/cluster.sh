#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on loopback, for the plugin tests, the benchmark and the demo.
#
#   cluster.sh start  DIR [--task-plugin cgroup|affinity] [--plugin SO] [--plugin-args "ARGS"]
#                         [--nodes N]            N slurmd on this host, nodes HOST-1..HOST-N
#                         [--lifetime SECONDS]   stop by itself after that long (tests: no leaks)
#                         [--gres-gpus "FILE..."] gres GPUs backed by these files, in index order
#                                                (default: $ZB_CLUSTER_GRES_GPUS)
#   cluster.sh plugstack DIR [--plugin SO] [--plugin-args "ARGS"]   rewrite plugstack.conf only
#   cluster.sh status DIR        exit 0 when the node answers and is idle/mixed/allocated
#   cluster.sh env    DIR        print "export SLURM_CONF=..." for eval
#   cluster.sh logs   DIR        print the daemons' logs
#   cluster.sh stop   DIR        cancel our jobs, stop our two daemons by their recorded pids
#
# DIR may also come from $ZB_CLUSTER_DIR. Everything the cluster writes lives in DIR: config,
# state, spool, logs, pids. No munge (auth/none, cred/none), SlurmUser=root, free ports picked at
# start, each node described with the CPU counts slurmd -C reports (with --nodes N they all
# share this host's CPUs: good for testing per-node logic, not for measuring). Needs root (slurmd must create
# cgroups and setuid), and the Debian packages slurmctld, slurmd and slurm-client. cgroup v1 or v2
# as the host mounts it; ZB_CONSTRAIN_CORES=no turns task/cgroup's ConstrainCores off, and
# ZB_CGROUP_JOB_ID_PATHS=yes|no sets CgroupJobIdPaths (Slurm 26.05 and later only: cgroup v2 job
# directories named job_<id>, or by SLUID, the default there).
#
# srun and slurmstepd both read plugstack.conf when a step starts, so `plugstack` changes the
# plugin or its arguments without restarting the daemons.
set -euo pipefail

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

verb=${1:-}
[ -n "$verb" ] || usage
shift
dir=${ZB_CLUSTER_DIR:-}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    dir=$1
    shift
fi
[ -n "$dir" ] || usage
task_plugin=affinity
plugin=""
plugin_args=""
lifetime=0
nnodes=1
gres_gpus=${ZB_CLUSTER_GRES_GPUS:-}
while [ $# -gt 0 ]; do
    case $1 in
    --task-plugin) task_plugin=$2; shift 2 ;;
    --plugin) plugin=$2; shift 2 ;;
    --plugin-args) plugin_args=$2; shift 2 ;;
    --lifetime) lifetime=$2; shift 2 ;;
    --nodes) nnodes=$2; shift 2 ;;
    --gres-gpus) gres_gpus=$2; shift 2 ;;
    *) usage ;;
    esac
done

conf=$dir/etc/slurm.conf
export SLURM_CONF=$conf

log() { echo "cluster.sh: $*" >&2; }

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Reads run/NAME.pid, which we wrote; prints the pid only while that process is still ours
# (its command line names PROGRAM, default NAME), so a recycled pid is never signalled.
our_pid() {
    local file=$dir/run/$1.pid pid
    [ -s "$file" ] || return 1
    pid=$(cat "$file")
    [ -d /proc/"$pid" ] || return 1
    tr '\0' ' ' </proc/"$pid"/cmdline | grep -q "${2:-$1}" || return 1
    echo "$pid"
}

# The node names: this host's short name, or HOST-1..HOST-N for several slurmd.
node_names() {
    local host i
    host=$(hostname -s)
    if [ "$nnodes" -eq 1 ]; then
        echo "$host"
    else
        for ((i = 1; i <= nnodes; i++)); do echo "$host-$i"; done
    fi
}

write_plugstack() {
    local file=$dir/etc/plugstack.conf
    if [ -n "$plugin" ]; then
        [ -f "$plugin" ] || { log "no such plugin: $plugin"; exit 1; }
        printf 'required %s %s\n' "$(readlink -f "$plugin")" "$plugin_args" >"$file.tmp"
    else
        : >"$file.tmp"
    fi
    mv "$file.tmp" "$file"
}

write_config() {
    local ctld_port hw tp pt first_id name port nodes="" used
    ctld_port=$(free_port)
    used=" $ctld_port "
    # slurmd -C describes this machine; RealMemory is left out so a busy host never drains it.
    hw=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //; s/ RealMemory=[0-9]*//')
    case $task_plugin in
    cgroup) tp=task/cgroup,task/affinity pt=proctrack/cgroup ;;
    affinity) tp=task/affinity pt=proctrack/linuxproc ;;
    *) log "--task-plugin must be cgroup or affinity"; exit 2 ;;
    esac
    # Job ids name the cgroup directories (slurm/uid_0/job_N), which concurrent clusters on this
    # host share: start each cluster at a random id so they do not collide.
    first_id=$(((RANDOM << 8 | RANDOM % 256) % 60000000 + 1000))
    cat >"$conf" <<EOF
ClusterName=zbtest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/state/slurmctld.pid
SlurmdPidFile=$dir/spool/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=${ZB_SLURMD_DEBUG:-info}
PlugStackConfig=$dir/etc/plugstack.conf
MpiDefault=none
ProctrackType=$pt
TaskPlugin=$tp
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
FirstJobId=$first_id
MinJobAge=10
KillWait=5
InactiveLimit=0
SlurmdTimeout=120
EOF
    write_gres
    for name in $(node_names); do
        port=$(free_port)
        while [[ $used == *" $port "* ]]; do port=$(free_port); done
        used+="$port "
        mkdir -p "$dir/spool/$name"
        echo "NodeName=$name NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$port $hw" \
            "$gres_node State=UNKNOWN" >>"$conf"
        nodes+=${nodes:+,}$name
    done
    echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >>"$conf"
    # Read by task/cgroup and proctrack/cgroup: cgroup v1 controllers (hybrid), or the unified
    # cgroup v2 hierarchy where /sys/fs/cgroup is one (debian_root.sh's VM). There, without
    # systemd, IgnoreSystemd=yes (Slurm 24.11's cgroup/v2) makes slurmd create its cgroups itself.
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' >"$dir/etc/cgroup.conf"
    else
        printf 'CgroupPlugin=cgroup/v1\n' >"$dir/etc/cgroup.conf"
    fi
    # ZB_CONSTRAIN_CORES=no: task/cgroup leaves the step's cpuset to its parent's.
    cat >>"$dir/etc/cgroup.conf" <<EOF
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=${ZB_CONSTRAIN_CORES:-yes}
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
    if [ -n "${ZB_CGROUP_JOB_ID_PATHS:-}" ]; then
        echo "CgroupJobIdPaths=$ZB_CGROUP_JOB_ID_PATHS" >>"$dir/etc/cgroup.conf"
    fi
}

# --gres-gpus: one gres.conf line per file (Slurm only stats them), GPU i = the i-th file.
gres_node=""
write_gres() {
    local file n=0
    [ -n "$gres_gpus" ] || return 0
    : >"$dir/etc/gres.conf"
    for file in $gres_gpus; do
        echo "Name=gpu File=$file" >>"$dir/etc/gres.conf"
        n=$((n + 1))
    done
    echo "GresTypes=gpu" >>"$conf"
    gres_node="Gres=gpu:$n"
}

# Succeeds when slurmctld answers and every node is up (idle, mixed or allocated).
nodes_up() {
    local states
    states=$(sinfo -h -N -o '%t' 2>/dev/null) || return 1
    [ "$(echo "$states" | grep -cE '^(idle|mix|alloc)$')" -eq "$(node_names | wc -l)" ]
}

wait_idle() {
    for _ in $(seq 60); do
        nodes_up && return 0
        sleep 0.5
    done
    log "nodes not idle after 30 s: $(sinfo -h -N -o '%N=%t' 2>&1 | tr '\n' ' ')"
    return 1
}

start() {
    [ "$(id -u)" -eq 0 ] || { log "needs root"; exit 1; }
    if our_pid slurmctld >/dev/null; then
        log "a cluster already runs in $dir; stop it first"
        exit 1
    fi
    mkdir -p "$dir"/{etc,state,spool,log,run}
    dir=$(readlink -f "$dir")
    conf=$dir/etc/slurm.conf
    export SLURM_CONF=$conf
    write_config
    write_plugstack
    # Our own process groups (setsid) so a test runner's signals do not reach them; -D keeps
    # them in the foreground so $! is the daemon's pid.
    setsid slurmctld -D -c -f "$conf" >>"$dir/log/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$dir/run/slurmctld.pid"
    for _ in $(seq 40); do
        scontrol ping 2>/dev/null | grep -q UP && break
        sleep 0.25
    done
    for name in $(node_names); do
        setsid slurmd -D -N "$name" -f "$conf" >>"$dir/log/slurmd-$name.out" 2>&1 </dev/null &
        echo $! >"$dir/run/slurmd-$name.pid"
    done
    if ! wait_idle; then
        logs
        stop
        exit 1
    fi
    if [ "$lifetime" -gt 0 ]; then
        # Outlives a test runner killed on timeout, which would otherwise leak both daemons.
        setsid bash -c 'sleep "$1"; "$2" stop "$3"' watchdog "$lifetime" "$(readlink -f "$0")" \
            "$dir" >/dev/null 2>&1 </dev/null &
        echo $! >"$dir/run/watchdog.pid"
    fi
    log "up in $dir ($task_plugin): export SLURM_CONF=$conf"
}

logs() {
    local f
    for f in "$dir"/log/*; do
        [ -f "$f" ] || continue
        echo "==== $f" >&2
        tail -n 60 "$f" >&2
    done
}

# SIGTERM to the daemons of these pid files, SIGKILL to any still there 10 s later.
terminate() {
    local file name pid alive pids=()
    for file in "$@"; do
        name=$(basename "$file" .pid)
        pid=$(our_pid "$name" "${name%%-*}") && pids+=("$pid") && kill -TERM "$pid" 2>/dev/null
        rm -f "$file"
    done
    for _ in $(seq 40); do
        alive=0
        for pid in "${pids[@]}"; do [ -d /proc/"$pid" ] && alive=1; done
        [ $alive -eq 0 ] && return 0
        sleep 0.25
    done
    for pid in "${pids[@]}"; do
        [ -d /proc/"$pid" ] || continue
        log "pid $pid ignored SIGTERM for 10 s; SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    done
}

stop() {
    local pid
    if our_pid slurmctld >/dev/null; then
        scancel --full -u root 2>/dev/null || true
        for _ in $(seq 40); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    # Every slurmd at once, then slurmctld; each by the pid we recorded.
    terminate "$dir"/run/slurmd-*.pid
    terminate "$dir"/run/slurmctld.pid
    if pid=$(our_pid watchdog) && [ "$pid" != "$PPID" ]; then
        kill -TERM -- -"$pid" 2>/dev/null || true # its own process group: bash and its sleep
    fi
    rm -f "$dir/run/watchdog.pid"
}

case $verb in
start) start ;;
stop) stop ;;
status)
    our_pid slurmctld >/dev/null || { log "not running"; exit 1; }
    for file in "$dir"/run/slurmd-*.pid; do
        our_pid "$(basename "$file" .pid)" slurmd >/dev/null || { log "$file: not running"; exit 1; }
    done
    sinfo -N
    nodes_up
    ;;
plugstack) write_plugstack ;;
env) echo "export SLURM_CONF=$(readlink -f "$conf")" ;;
logs) logs ;;
*) usage ;;
esac
