#!/usr/bin/env bash
# The main job: install what is missing, build, and show how zenflow-bind splits this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default >/dev/null
zenbind=build/default/cli/zenbind
echo "== zenbind show"
"$zenbind" show
echo
echo "== zenbind plan --tasks 1 (this machine, this process's allowed CPUs)"
"$zenbind" plan --tasks 1
echo
echo "== zenbind plan --tasks 8 on a two-socket SMT box (node0 = CPUs 0-15,32-47)"
"$zenbind" plan --tasks 8 --synthetic "pack:2 [numa] core:16 pu:2(indexes=core:pack)"
