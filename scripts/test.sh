#!/usr/bin/env bash
# Runs every test of zenflow-bind, exactly as CI does (.ci/run calls this):
#   formatting, the default build with all test labels (unit, cli, python, slurm, package, roots),
#   the arm64 cross build (its unit tests under qemu-user, its packages), the unit tests again
#   under ASan+UBSan, and a short libFuzzer run over the input parsers.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/check-format.sh

step() { printf '\n=== %s\n' "$*"; }

# ctest hides a skipped test's output: name every skip and the reason it printed ("SKIP: why").
report_skips() {
  local log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || return 0
  awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} /^SKIP: /{print "skipped: " name ": " substr($0, 7)}' "$log"
}

step "Debian roots of other releases (tests/roots: made once per machine, then cached)"
# Made here, both at once, so that a cold machine shows their progress in the log; ctest's
# roots_*_root then finds them made. Where one cannot be made, its tests say why.
pids=()
for release in trixie forky; do
  bash tests/roots/debian_root.sh "$release" root >/dev/null &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || echo "a Debian root could not be made (exit $?): see the roots tests"
done

step "build and test (default preset)"
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default || { report_skips build/default; exit 1; }
report_skips build/default

step "arm64: cross build, unit tests under qemu-user, packages (aarch64 preset)"
# After the default build: adam_digest_cross compares the kernels' bits with its test_adam.
bash scripts/qemu-binfmt.sh
cmake --preset aarch64 >/dev/null
cmake --build --preset aarch64
ctest --preset aarch64

step "unit tests under ASan+UBSan (asan preset)"
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan

step "fuzz the user-input parsers (fuzz preset)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
ctest --preset fuzz
