#!/usr/bin/env bash
# The main job, end to end on this machine: install what is missing, build, start a throwaway
# Slurm cluster on loopback (scripts/cluster.sh) and train a small PyTorch transformer
# (contrib/demo/train_transformer.py) twice:
#   - with zenflow_bind.optim.AdamW in overlap mode under `srun --zenflow-bind=verbose`,
#     checkpointed half-way, stopped, and resumed in a new srun step;
#   - with torch.optim.AdamW under plain srun (what users do today), stopped and resumed alike.
# Prints both side by side (contrib/demo/report.py), writes a picture of loss and step time per
# step, then runs the C++ example trainer once, and stops the cluster. Needs root (slurmd).
# Tunables: ZB_DEMO_STEPS (default 100), ZB_DEMO_ARGS (more train_transformer.py options),
# ZB_DEMO_OUT (where the logs and the picture go, default build/default/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default >/dev/null
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: needs root to start slurmd" >&2; exit 1; }

build=$root/build/default
out=${ZB_DEMO_OUT:-$build/demo}
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.pt
export PYTHONPATH=$root/python
export ZENFLOW_BIND_LIB=$build/libzenbind/libzenbind.so.2
export ZENFLOW_OPTIMIZER=$build/optimizer/zenflow-optimizer
cluster=$(mktemp -d /tmp/zenflow-demo.XXXXXX)
stop() { bash scripts/cluster.sh stop "$cluster" >/dev/null 2>&1 || true; rm -rf "$cluster"; }
trap stop EXIT
bash scripts/cluster.sh start "$cluster" --task-plugin cgroup \
    --plugin "$build/spank_plugin/zenflow_bind.so" --lifetime 900
eval "$(bash scripts/cluster.sh env "$cluster")"

cpus=$(nproc)
steps=${ZB_DEMO_STEPS:-100}
half=$((steps / 2))
read -ra extra <<<"${ZB_DEMO_ARGS:-}"
train=(/usr/bin/python3 "$root/contrib/demo/train_transformer.py" --steps "$steps"
       --save-at "$half" "${extra[@]}")

# run NAME SRUN-OPTIONS...: the first half, stopped at its checkpoint, then the rest in a new step
run() {
    local name=$1 optimizer=$2
    shift 2
    local args=(--optimizer "$optimizer" --checkpoint "$out/$name.pt" --log "$out/$name.jsonl")
    echo "== srun -n1 -c$cpus${*:+ $*} $(basename "${train[1]}") --optimizer $optimizer: steps 1-$half"
    srun -n1 -c"$cpus" "$@" "${train[@]}" "${args[@]}" --stop-at-save
    echo "== a new srun step resumes from $out/$name.pt: steps $((half + 1))-$steps"
    srun -n1 -c"$cpus" "$@" "${train[@]}" "${args[@]}" --resume "$out/$name.pt"
}
run zenflow zenflow --zenflow-bind=verbose
# torch's own thread count, as a plain srun gives it; OMP_NUM_THREADS=$cpus makes OpenMP threads
# spin for a preempted sibling whenever another job shares the two cores
run torch torch
echo
/usr/bin/python3 contrib/demo/report.py --png "$out/demo.png" \
    "zenflow_bind.optim.AdamW (overlap), srun --zenflow-bind=$out/zenflow.jsonl" \
    "torch.optim.AdamW, plain srun=$out/torch.jsonl"
cat <<EOF
(medians per step, each segment's first step left out; optimizer step: the worker's own time,
or torch's step(); waiting: time the training process spent in step(); final loss: on a
held-out batch after the last step; B/param: parameters + gradients + optimizer state)
EOF

echo
echo "== For C/C++ trainers: contrib/demo/zenflow_demo.cpp drives the worker through its C API"
srun -n1 -c"$cpus" --zenflow-bind "$build/contrib/demo/zenflow-demo" \
    --params 4194304 --steps 10 --passes 4
