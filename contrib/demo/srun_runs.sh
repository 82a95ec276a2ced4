#!/usr/bin/env bash
# The demo's runs (contrib/demo/runs.sh) on a throwaway Slurm cluster on loopback
# (scripts/cluster.sh), each AdamW under the plan its user would choose, each resumed in a new
# srun step:
#   zenflow      zenflow_bind.optim.AdamW   srun --zenflow-bind=verbose (training and worker split)
#   torch        torch.optim.AdamW()        plain srun (what users do today)
#   torch-fused  AdamW(fused=True)          srun --zenflow-bind=mode=offload (the whole share
#                                           trains, OMP_NUM_THREADS set to it)
# Then the C API example (zenflow_demo.cpp) once. Logs go to OUT (contrib/demo/report.py reads
# them). scripts/demo.sh runs this inside the Debian forky root (tests/roots/debian_root.sh forky
# demo); it runs as well on any machine with Slurm and torch 2.x. ZB_DEMO_ARGS: more train_gpt.py
# options.
#   usage: srun_runs.sh BUILD_DIR OUT_DIR      (root: slurmd)
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/contrib/demo/runs.sh"
export PYTHONPATH=$src/python
export ZENFLOW_BIND_LIB=$build/libzenbind/libzenbind.so.2
export ZENFLOW_OPTIMIZER=$build/optimizer/zenflow-optimizer
cluster=$(mktemp -d /tmp/zenflow-demo.XXXXXX)
stop() {
    bash "$src/scripts/cluster.sh" stop "$cluster" >/dev/null 2>&1 || true
    rm -rf "$cluster"
}
trap stop EXIT
bash "$src/scripts/cluster.sh" start "$cluster" --task-plugin cgroup \
    --plugin "$build/spank_plugin/zenflow_bind.so" --lifetime 1800
eval "$(bash "$src/scripts/cluster.sh" env "$cluster")"
cpus=$(nproc)

# launch NAME COMMAND...: one task with every CPU, under NAME's srun options
launch() {
    local options=()
    case $1 in
    zenflow) options=(--zenflow-bind=verbose) ;;
    torch-fused) options=(--zenflow-bind=mode=offload) ;;
    esac
    echo "   srun -n1 -c$cpus ${options[*]}"
    srun -n1 -c"$cpus" "${options[@]}" "${@:2}"
}
echo "== $(srun --version)"
read -ra extra <<<"${ZB_DEMO_ARGS:-}"
demo_runs "$out" launch "${extra[@]}"

echo
echo "== For C/C++ trainers: contrib/demo/zenflow_demo.cpp drives the worker through its C API"
srun -n1 -c"$cpus" --zenflow-bind "$build/contrib/demo/zenflow-demo" \
    --params 4194304 --steps 10 --passes 4
