#!/usr/bin/env bash
# The demo's runs, on a throwaway Slurm cluster on loopback (scripts/cluster.sh), each AdamW under
# the plan its user would choose, each stopped at a DCP checkpoint half-way and resumed in a new
# srun step:
#   zenflow      zenflow_bind.optim.AdamW   srun --zenflow-bind=verbose (training and worker split)
#   torch        torch.optim.AdamW()        plain srun (what users do today)
#   torch-fused  AdamW(fused=True)          srun --zenflow-bind=mode=offload (the whole share
#                                           trains, OMP_NUM_THREADS set to it)
# and zenflow once more without stopping, whose weights the resumed run must equal bit for bit.
# Then the C API example (zenflow_demo.cpp) once. Logs go to OUT (contrib/demo/report.py reads
# them). scripts/demo.sh runs this inside the Debian forky root (tests/roots/debian_root.sh forky
# demo); it runs as well on any machine with Slurm and torch 2.x.
#   usage: srun_runs.sh BUILD_DIR OUT_DIR      (root: slurmd)
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
rm -rf "$out"/*.jsonl "$out"/*.dcp
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
# Every run, whichever AdamW: glibc's malloc keeps the memory a step frees for the next one.
# By default it hands large freed blocks back to the kernel, so the gradients backward allocates
# after zero_grad() are fresh pages, faulted in and zeroed every step: tens of thousands of
# faults, a third of this model's training step on a small machine, which would hide the
# optimizer's share (the report's "page faults per step" row). A GLIBC_TUNABLES of the caller's
# is kept.
keep=glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432
export GLIBC_TUNABLES=${GLIBC_TUNABLES-$keep}

cpus=$(nproc)
steps=${ZB_DEMO_STEPS:-200}
half=$((steps / 2))
read -ra extra <<<"${ZB_DEMO_ARGS:-}"
train=(python3 "$src/contrib/demo/train_gpt.py" --steps "$steps" --save-at "$half" "${extra[@]}")
echo "== $(python3 -c 'import torch, transformers; print("torch", torch.__version__,
    "transformers", transformers.__version__)'), $(srun --version), $cpus CPUs,
    GLIBC_TUNABLES=$GLIBC_TUNABLES"

# run NAME OPTIMIZER SRUN-OPTIONS...: the first half, stopped at its checkpoint, then the rest in a
# new srun step
run() {
    local name=$1 optimizer=$2
    shift 2
    local args=(--optimizer "$optimizer" --checkpoint "$out/$name.dcp" --log "$out/$name.jsonl")
    echo "== srun -n1 -c$cpus${*:+ $*} train_gpt.py --optimizer $optimizer: steps 1-$half"
    srun -n1 -c"$cpus" "$@" "${train[@]}" "${args[@]}" --stop-at-save
    echo "== a new srun step resumes from $out/$name.dcp: steps $((half + 1))-$steps"
    srun -n1 -c"$cpus" "$@" "${train[@]}" "${args[@]}" --resume "$out/$name.dcp"
}
run zenflow zenflow --zenflow-bind=verbose
run torch torch
run torch-fused torch-fused --zenflow-bind=mode=offload
echo "== srun -n1 -c$cpus --zenflow-bind train_gpt.py --optimizer zenflow: steps 1-$steps at once"
srun -n1 -c"$cpus" --zenflow-bind "${train[@]}" --optimizer zenflow --quiet \
    --save-at 0 --log "$out/zenflow-straight.jsonl"

echo
echo "== For C/C++ trainers: contrib/demo/zenflow_demo.cpp drives the worker through its C API"
srun -n1 -c"$cpus" --zenflow-bind "$build/contrib/demo/zenflow-demo" \
    --params 4194304 --steps 10 --passes 4
