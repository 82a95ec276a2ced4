#!/usr/bin/env bash
# The main job, end to end on this machine: install what is missing, build, start a throwaway
# Slurm cluster on loopback (tests/slurm/cluster.sh), run a ZenFlow-style workload under
# `srun --zenflow-bind=verbose` and again without binding, print both side by side, stop the
# cluster. Needs root (slurmd). Tunables: ZB_DEMO_PARAMS, ZB_DEMO_STEPS, ZB_DEMO_PASSES.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default >/dev/null
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: needs root to start slurmd" >&2; exit 1; }

build=$root/build/default
demo=$build/contrib/demo/zenflow-demo
export ZENFLOW_OPTIMIZER=$build/optimizer/zenflow-optimizer
cluster=$(mktemp -d /tmp/zenflow-demo.XXXXXX)
stop() { bash tests/slurm/cluster.sh stop "$cluster" >/dev/null 2>&1 || true; rm -rf "$cluster"; }
trap stop EXIT
bash tests/slurm/cluster.sh start "$cluster" --task-plugin cgroup \
    --plugin "$build/spank_plugin/zenflow_bind.so" --lifetime 900
eval "$(bash tests/slurm/cluster.sh env "$cluster")"

cpus=$(nproc)
args=(--params "${ZB_DEMO_PARAMS:-67108864}" --steps "${ZB_DEMO_STEPS:-20}"
      --passes "${ZB_DEMO_PASSES:-12}" --json)
echo "== srun -n1 -c$cpus --zenflow-bind=verbose zenflow-demo (training and optimizer on their own cores)"
srun -n1 -c"$cpus" --zenflow-bind=verbose "$demo" "${args[@]}" >"$cluster/bound.json"
cat "$cluster/bound.json"
echo "== srun -n1 -c$cpus zenflow-demo (no binding: both sides on every core of the task)"
srun -n1 -c"$cpus" "$demo" "${args[@]}" >"$cluster/unbound.json"
cat "$cluster/unbound.json"
echo
/usr/bin/python3 - "$cluster/bound.json" "$cluster/unbound.json" <<'PY'
import json, sys
rows = [("--zenflow-bind", json.load(open(sys.argv[1]))), ("no binding", json.load(open(sys.argv[2])))]
cols = [("", lambda r: r[0]),
        ("step ms", lambda r: "%.1f" % r[1]["step_ms"]),
        ("compute ms", lambda r: "%.1f" % r[1]["compute_ms"]),
        ("waited for optimizer ms", lambda r: "%.1f" % r[1]["wait_ms"]),
        ("optimizer step ms", lambda r: "%.1f" % r[1]["opt_ms"]),
        ("training CPUs (threads)", lambda r: "%s (%d)" % (r[1]["train_cpus"], r[1]["train_threads"])),
        ("optimizer CPUs (threads)", lambda r: "%s (%d)" % (r[1]["opt_cpus"], r[1]["opt_threads"])),
        ("loss first -> last", lambda r: "%.4f -> %.4f" % (r[1]["loss_first"], r[1]["loss_last"]))]
table = [[c[0] for c in cols]] + [[c[1](r) for c in cols] for r in rows]
width = [max(len(t[i]) for t in table) for i in range(len(cols))]
for t in table:
    print("  ".join(v.ljust(w) for v, w in zip(t, width)).rstrip())
b, u = rows[0][1], rows[1][1]
print("\nstep time with binding / without: %.2f" % (b["step_ms"] / u["step_ms"]))
PY
