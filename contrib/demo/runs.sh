# shellcheck shell=bash
# The demo's runs, whatever launches them; sourced by contrib/demo/srun_runs.sh (srun on a Slurm
# cluster) and bench/gpu_run.sh demo (a GPU machine without Slurm, each run given by hand what srun
# would give it). Each AdamW trains train_gpt.py, stopped at a DCP checkpoint half-way and resumed
# in a new process, then zenflow once more without stopping, whose weights the resumed run must
# equal bit for bit (report.py --straight). Logs go to OUT, one NAME.jsonl per run, for report.py.
#
#   demo_runs OUT LAUNCH [TRAIN_GPT_ARGS...]
#
# LAUNCH is a command (a shell function) called as `LAUNCH NAME COMMAND...`: it runs COMMAND the
# way NAME's user would, NAME being zenflow (zenflow_bind.optim.AdamW), torch (torch.optim.AdamW())
# or torch-fused (AdamW(fused=True)). ZB_DEMO_STEPS (default 200) sets the length; PYTHON the
# interpreter (default python3).

# Every run, whichever AdamW: glibc's malloc keeps the memory a step frees for the next one. By
# default it hands large freed blocks back to the kernel, so the gradients backward allocates after
# zero_grad() are fresh pages, faulted in and zeroed every step: tens of thousands of faults, a
# third of this model's training step on a small machine, which would hide the optimizer's share
# (the report's "page faults per step" row). A GLIBC_TUNABLES of the caller's, even empty, is kept.
demo_tunables=glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432

demo_runs() {
    local out=$1 launch=$2
    shift 2
    local steps=${ZB_DEMO_STEPS:-200} py=${PYTHON:-python3}
    local half=$((steps / 2)) here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    export GLIBC_TUNABLES=${GLIBC_TUNABLES-$demo_tunables}
    mkdir -p "$out"
    rm -rf "$out"/*.jsonl "$out"/*.dcp
    local train=("$py" "$here/train_gpt.py" --steps "$steps" --save-at "$half" "$@")
    echo "== $("$py" -c 'import torch, transformers; print("torch", torch.__version__,
        "transformers", transformers.__version__)'), $(nproc) CPUs, GLIBC_TUNABLES=$GLIBC_TUNABLES"
    local name
    for name in zenflow torch torch-fused; do
        local args=(--optimizer "$name" --checkpoint "$out/$name.dcp" --log "$out/$name.jsonl")
        echo "== $name: steps 1-$half, stopped at its checkpoint"
        "$launch" "$name" "${train[@]}" "${args[@]}" --stop-at-save
        echo "== $name: a new process resumes from $out/$name.dcp: steps $((half + 1))-$steps"
        "$launch" "$name" "${train[@]}" "${args[@]}" --resume "$out/$name.dcp"
    done
    echo "== zenflow: steps 1-$steps at once"
    "$launch" zenflow "${train[@]}" --optimizer zenflow --quiet --save-at 0 \
        --log "$out/zenflow-straight.jsonl"
}
