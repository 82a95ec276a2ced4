#!/bin/bash
# The GPU test and benchmark, for a CUDA machine that has torch but neither a compiler nor
# Debian's hwloc and libnuma.
#
#   bench/gpu_run.sh prepare     here: build the default preset and gather what the GPU machine
#                                needs into build/gpu (libzenbind, zenflow-optimizer, Debian's
#                                libhwloc15, libnuma1, libgomp1, libudev1 unpacked by dpkg -x)
#   bench/gpu_run.sh [test|bench|cpu|all] [ARGS]
#                                there, from the repository root, with $PYTHON (else python3)
#                                that has torch: tests/python/test_gpu.py, test_gpu_fsdp2.py
#                                and test_demo.py,
#                                bench/gpu_offload.py ARGS, and (cpu) that machine's CPU: the
#                                kernel against its roofline and against torch's fused AdamW, on
#                                one core and all
#   bench/gpu_run.sh demo [ARGS] there, with transformers too: the demo (contrib/demo) on the
#                                GPU, train_gpt.py --deterministic ARGS, its table and picture
#                                (ZB_DEMO_OUT, default build/gpu-demo)
#   bench/gpu_run.sh repeat [ARGS]
#                                there: train_gpt.py ARGS twice straight with each AdamW, as the
#                                demo runs it, and whether the two runs are bit-identical (which
#                                side, if any, is not deterministic run to run on that GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu

prepare() {
    cmake --preset default >/dev/null
    cmake --build build/default -j"$(nproc)" --target zenbind zenbind-cli zenflow-optimizer zenflow-bench
    rm -rf "$out" && mkdir -p "$out/debs"
    cp -L build/default/libzenbind/libzenbind.so.2 build/default/optimizer/zenflow-optimizer \
        build/default/bench/zenflow-bench build/default/cli/zenbind "$out/"
    (cd "$out/debs" && apt-get download libhwloc15 libnuma1 libgomp1 libudev1 2>/dev/null)
    for deb in "$out"/debs/*.deb; do dpkg -x "$deb" "$out/root"; done
    rm -rf "$out/debs"
    du -sh "$out"
}

run() {
    [ -x "$out/zenflow-optimizer" ] || { echo "no $out: run '$0 prepare' where the project builds" >&2; exit 1; }
    export LD_LIBRARY_PATH="$PWD/$out:$PWD/$out/root/usr/lib/x86_64-linux-gnu:$PWD/$out/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$PWD/python" ZENFLOW_BIND_LIB="$PWD/$out/libzenbind.so.2" \
        ZENFLOW_OPTIMIZER="$PWD/$out/zenflow-optimizer"
    local what=$1
    shift
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    lscpu | grep -E '^(Model name|CPU\(s\)|NUMA node\(s\))' || true
    if [ "$what" = test ] || [ "$what" = all ]; then
        # test_demo trains on the GPU there (train_gpt.py's default device): its resume through
        # DCP, bit for bit, with the model on the GPU and the optimizer in the worker
        (cd tests/python && "${PYTHON:-python3}" test_gpu.py -v &&
            "${PYTHON:-python3}" test_gpu_fsdp2.py -v && "${PYTHON:-python3}" test_demo.py -v)
    fi
    if [ "$what" = bench ] || [ "$what" = all ]; then
        "${PYTHON:-python3}" bench/gpu_offload.py "$@"
    fi
    if [ "$what" = demo ] || [ "$what" = repeat ]; then
        "$what" "$@"
    fi
    if [ "$what" = cpu ] || [ "$what" = all ]; then
        local all
        all=$(nproc)
        for t in 1 "$all"; do
            "$out/zenflow-bench" adam --elements 100000000 --threads "$t" --steps 10
            "$out/zenflow-bench" adam --elements 100000000 --threads "$t" --grad bf16 \
                --copy-out bf16 --steps 10
            "${PYTHON:-python3}" bench/fused_bench.py --threads "$t"
        done
    fi
}

# The demo's runs (contrib/demo/runs.sh) on a GPU machine, which has no Slurm: each run gets by
# hand what srun would give it. zenflow_bind.optim.AdamW gets `srun --zenflow-bind=train=2`'s split
# of this machine (zenbind plan for one task: training bound by taskset with OMP_NUM_THREADS, the
# worker's CPUs and NUMA node in ZENFLOW_OPT_*), torch's AdamWs every CPU, as under plain srun.
demo() {
    local py=${PYTHON:-python3} dir=${ZB_DEMO_OUT:-build/gpu-demo}
    plan_split
    source contrib/demo/runs.sh
    # --deterministic: on a GPU two runs of one command differ from a few steps on, whichever
    # AdamW (`repeat` shows it), and the resumed run could not be compared with the straight one
    demo_runs "$dir" demo_launch --deterministic "$@"
    "$py" contrib/demo/report.py --png "$dir/demo.png" --straight "$dir/zenflow-straight.jsonl" \
        --resumed-in "a new process" \
        "zenflow_bind.optim.AdamW, the worker on CPUs $demo_opt=$dir/zenflow.jsonl" \
        "torch.optim.AdamW()=$dir/torch.jsonl" "AdamW(fused=True)=$dir/torch-fused.jsonl"
}

# The split `srun --zenflow-bind=train=2` would give one task on this machine (ZB_DEMO_PLAN).
plan_split() {
    local plan
    plan=$("$out/zenbind" plan --tasks 1 --json --options "${ZB_DEMO_PLAN:-train=2}")
    read -r demo_train demo_opt demo_train_threads demo_opt_threads demo_mems < <("$py" -c '
import json, sys
t = json.load(sys.stdin)["tasks"][0]
print(t["train_cpus"], t["opt_cpus"], t["train_threads"], t["opt_threads"], t["opt_mems"])' \
        <<<"$plan")
}

# Each AdamW's straight run twice, launched as the demo launches it (bench/repeat_report.py).
repeat() {
    local py=${PYTHON:-python3} dir=${ZB_DEMO_OUT:-build/gpu-repeat} name k
    plan_split
    mkdir -p "$dir" && rm -f "$dir"/*.jsonl
    source contrib/demo/runs.sh
    export GLIBC_TUNABLES=${GLIBC_TUNABLES-$demo_tunables}
    for name in zenflow torch-fused torch; do
        for k in 1 2; do
            demo_launch "$name" "$py" contrib/demo/train_gpt.py --optimizer "$name" --save-at 0 \
                --quiet --log "$dir/$name-$k.jsonl" "$@"
        done
        "$py" bench/repeat_report.py "$name" "$dir/$name-1.jsonl" "$dir/$name-2.jsonl"
    done
}

# demo_launch NAME COMMAND...: zenflow on the plan's split, torch's AdamWs on every CPU
demo_launch() {
    if [ "$1" = zenflow ]; then
        echo "   training on CPUs $demo_train ($demo_train_threads threads), the worker on $demo_opt"
        env OMP_NUM_THREADS="$demo_train_threads" ZENFLOW_TRAIN_CPUS="$demo_train" \
            ZENFLOW_OPT_CPUS="$demo_opt" ZENFLOW_OPT_THREADS="$demo_opt_threads" \
            ZENFLOW_OPT_MEMS="$demo_mems" taskset -c "$demo_train" "${@:2}"
    else
        echo "   every CPU"
        "${@:2}"
    fi
}

case ${1:-all} in
prepare) prepare ;;
test | bench | cpu | all) run "${1:-all}" "${@:2}" ;;
demo | repeat) run "$1" "${@:2}" ;;
*) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
