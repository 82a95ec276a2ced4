#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on loopback, for the plugin tests, the benchmark and the demo.
#
#   cluster.sh start  DIR [--task-plugin cgroup|affinity] [--plugin SO] [--plugin-args "ARGS"]
#                         [--lifetime SECONDS]   stop by itself after that long (tests: no leaks)
#   cluster.sh plugstack DIR [--plugin SO] [--plugin-args "ARGS"]   rewrite plugstack.conf only
#   cluster.sh status DIR        exit 0 when the node answers and is idle/mixed/allocated
#   cluster.sh env    DIR        print "export SLURM_CONF=..." for eval
#   cluster.sh logs   DIR        print the daemons' logs
#   cluster.sh stop   DIR        cancel our jobs, stop our two daemons by their recorded pids
#
# DIR may also come from $ZB_CLUSTER_DIR. Everything the cluster writes lives in DIR: config,
# state, spool, logs, pids. No munge (auth/none, cred/none), SlurmUser=root, free ports picked at
# start, the node described with the CPU counts slurmd -C reports. Needs root (slurmd must create
# cgroups and setuid), and the Debian packages slurmctld, slurmd and slurm-client.
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
while [ $# -gt 0 ]; do
    case $1 in
    --task-plugin) task_plugin=$2; shift 2 ;;
    --plugin) plugin=$2; shift 2 ;;
    --plugin-args) plugin_args=$2; shift 2 ;;
    --lifetime) lifetime=$2; shift 2 ;;
    *) usage ;;
    esac
done

conf=$dir/etc/slurm.conf
export SLURM_CONF=$conf

log() { echo "cluster.sh: $*" >&2; }

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Reads a pid file we wrote; prints the pid only if that process is still one of our daemons.
our_pid() {
    local file=$dir/run/$1.pid pid
    [ -s "$file" ] || return 1
    pid=$(cat "$file")
    [ -d /proc/"$pid" ] || return 1
    tr '\0' ' ' </proc/"$pid"/cmdline | grep -q "$1" || return 1
    echo "$pid"
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
    local ctld_port slurmd_port node tp pt first_id
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
    # slurmd -C describes this machine; RealMemory is left out so a busy host never drains it.
    node=$(slurmd -C | head -1 | sed 's/ RealMemory=[0-9]*//')
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
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.daemon.pid
SlurmdPidFile=$dir/run/slurmd.daemon.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$(hostname -s) Default=YES MaxTime=INFINITE State=UP
EOF
    # Read by task/cgroup and proctrack/cgroup; this host mounts cgroup v1 controllers (hybrid).
    cat >"$dir/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
}

node_state() { sinfo -h -N -o '%t' 2>/dev/null | head -1; }

wait_idle() {
    local state=""
    for _ in $(seq 60); do
        state=$(node_state || true)
        case $state in idle | mix | alloc) return 0 ;; esac
        sleep 0.5
    done
    log "node not idle after 30 s (state: '${state:-no answer}')"
    return 1
}

start() {
    [ "$(id -u)" -eq 0 ] || { log "needs root"; exit 1; }
    if our_pid slurmctld >/dev/null || our_pid slurmd >/dev/null; then
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
    setsid slurmd -D -f "$conf" >>"$dir/log/slurmd.out" 2>&1 </dev/null &
    echo $! >"$dir/run/slurmd.pid"
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

stop() {
    local name pid
    if our_pid slurmctld >/dev/null; then
        scancel --full -u root 2>/dev/null || true
        for _ in $(seq 40); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    for name in slurmd slurmctld; do
        pid=$(our_pid $name) || continue
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 40); do
            [ -d /proc/"$pid" ] || break
            sleep 0.25
        done
        if [ -d /proc/"$pid" ]; then
            log "$name ($pid) ignored SIGTERM for 10 s; SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/run/$name.pid"
    done
    if pid=$(our_pid watchdog) && [ "$pid" != "$PPID" ]; then
        kill -TERM -- -"$pid" 2>/dev/null || true # its own process group: bash and its sleep
    fi
    rm -f "$dir/run/watchdog.pid"
}

case $verb in
start) start ;;
stop) stop ;;
status)
    our_pid slurmctld >/dev/null && our_pid slurmd >/dev/null || { log "not running"; exit 1; }
    sinfo -N
    case $(node_state) in idle | mix | alloc) ;; *) exit 1 ;; esac
    ;;
plugstack) write_plugstack ;;
env) echo "export SLURM_CONF=$(readlink -f "$conf")" ;;
logs) logs ;;
*) usage ;;
esac
