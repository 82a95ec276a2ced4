#!/usr/bin/env bash
# The main job, end to end, on the stack users run: Debian forky's torch 2.14, transformers 5 and
# Slurm 26.05, in a Debian root the project makes and caches (tests/roots/debian_root.sh). Installs
# what is missing here, builds the root on a first run (it says so, with progress, its size and
# time), builds the plugin and the worker in it, and there on a throwaway Slurm cluster trains a
# GPT-2-style decoder on text the machine ships three ways, each stopped at a DCP checkpoint and
# resumed in a new srun step (contrib/demo/srun_runs.sh): zenflow_bind.optim.AdamW under
# `srun --zenflow-bind`, torch.optim.AdamW() under plain srun, AdamW(fused=True) under
# `--zenflow-bind=mode=offload`. Then prints them side by side and draws them
# (contrib/demo/report.py). Needs root (debootstrap, chroot, slurmd).
# Tunables: ZB_DEMO_STEPS (default 200), ZB_DEMO_ARGS (more train_gpt.py options), ZB_DEMO_OUT
# (where the logs and the picture go, default build/demo), GLIBC_TUNABLES (default: glibc's malloc
# keeps the memory a step frees, for every run alike, see contrib/demo/runs.sh; set it empty
# for glibc's own defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: needs root (debootstrap, chroot, slurmd)" >&2; exit 1; }
out=${ZB_DEMO_OUT:-$PWD/build/demo}

bash scripts/install-deps.sh
start=$SECONDS
echo "demo.sh: the Debian forky root (torch 2.14, Slurm 26.05): a first run builds it (about" \
    "2.5 GB under /var/cache/zenflow-bind, minutes from a Debian mirror; progress below), the" \
    "next runs reuse it"
bash tests/roots/debian_root.sh forky root >/dev/null
bash tests/roots/debian_root.sh forky demo "$out"
echo
echo "(the runs took $((SECONDS - start)) s, root included)"
/usr/bin/python3 contrib/demo/report.py --png "$out/demo.png" --gpu-figures bench/README.md \
    "zenflow_bind.optim.AdamW, srun --zenflow-bind=$out/zenflow.jsonl" \
    "torch.optim.AdamW(), plain srun=$out/torch.jsonl" \
    "AdamW(fused=True), --zenflow-bind=mode=offload=$out/torch-fused.jsonl" \
    --straight "$out/zenflow-straight.jsonl"
