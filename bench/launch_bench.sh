#!/usr/bin/env bash
# What zenflow_bind.so adds to task launch: `srun -n2 true` timed on a throwaway cluster
# (scripts/cluster.sh) in three set-ups, alternated round by round in one run:
#   none     plugstack.conf without the plugin: Slurm alone, the baseline
#   loaded   the plugin loaded, no option: what installing it costs every job
#   bound    the plugin loaded and --zenflow-bind: topology load, plan, affinity, environment
# The fair question is "bound vs none" (same srun, same tasks, binding is the only difference);
# "loaded vs none" must stay ~1.00. Prints each median and the ratios to the baseline.
#
#   launch_bench.sh PLUGIN_SO [ROUNDS]     (root; ZB_TASK_PLUGIN=cgroup|affinity, default cgroup)
set -euo pipefail

plugin=${1:?usage: launch_bench.sh PLUGIN_SO [ROUNDS]}
rounds=${2:-15}
here=$(cd "$(dirname "$0")" && pwd)
cluster=${ZB_CLUSTER_SH:-$here/../scripts/cluster.sh}

dir=$(mktemp -d /tmp/zb-bench-XXXXXX)
trap '"$cluster" stop "$dir"; rm -rf "$dir"' EXIT
"$cluster" start "$dir" --task-plugin "${ZB_TASK_PLUGIN:-cgroup}" >/dev/null
export SLURM_CONF=$dir/etc/slurm.conf

declare -A samples=([none]="" [loaded]="" [bound]="")
run_one() {
    local setup=$1 t0 t1 opt=()
    case $setup in
    none) "$cluster" plugstack "$dir" ;;
    loaded) "$cluster" plugstack "$dir" --plugin "$plugin" ;;
    bound) "$cluster" plugstack "$dir" --plugin "$plugin"; opt=(--zenflow-bind) ;;
    esac
    t0=$(date +%s%N)
    srun -n2 "${opt[@]}" true 2>>"$dir/srun.err" || { cat "$dir/srun.err" >&2; exit 1; }
    t1=$(date +%s%N)
    samples[$setup]+="$(((t1 - t0) / 1000)) "
}

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

run_one none # warm-up: first step after start pays for caches
order=(none loaded bound)
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < 3; i++)); do run_one "${order[(r + i) % 3]}"; done
done

base=$(echo "${samples[none]}" | median)
printf 'srun -n2 true, %d rounds, TaskPlugin %s, median wall time:\n' "$rounds" "${ZB_TASK_PLUGIN:-cgroup}"
for s in none loaded bound; do
    m=$(echo "${samples[$s]}" | median)
    awk -v s="$s" -v m="$m" -v b="$base" 'BEGIN { printf "  %-7s %8.1f ms   ratio to none %.3f\n", s, m / 1000, m / b }'
done
