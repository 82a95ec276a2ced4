#!/usr/bin/env bash
# A fuzz campaign outside CI: every libFuzzer target of the fuzz preset (ASan+UBSan) for RUNS
# executions (default 10 million) or SECONDS at most, on a copy of its corpus; then the corpus is
# minimised (-merge=1) back into tests/fuzz/corpus/NAME, so what the campaign found stays as seeds
# for CI's short runs. Prints executions, time and coverage per target. A crash stops with the
# input saved in the work directory (copy it into the corpus as a regression seed once fixed).
#   usage: tests/fuzz/campaign.sh [RUNS] [SECONDS] [TARGET...]   (run from the source tree; no
#          TARGET: every fuzz_* target. Two calls with disjoint targets use two cores.)
#   MAX_LEN (default 16384): the longest input tried. A target whose valid inputs get slow to check
#          as they grow (fuzz_gpu_map: a map of a thousand GPUs) reaches 10 million runs only with
#          a smaller one; its longer inputs take the same loop as short ones.
set -euo pipefail
runs=${1:-10000000} seconds=${2:-3600} max_len=${MAX_LEN:-16384}
shift $(($# < 2 ? $# : 2))
src=$(pwd)
if [ $# -eq 0 ] || [ ! -x "$src/build/fuzz/tests/fuzz/$1" ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz >/dev/null
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(cd "$src/build/fuzz/tests/fuzz" && ls fuzz_*))
work=$(mktemp -d /tmp/zb-fuzz-campaign.XXXXXX)
echo "campaign in $work: $runs executions or $seconds s per target, inputs up to $max_len bytes; $(uptime)"
for name in "${targets[@]}"; do
  bin=$src/build/fuzz/tests/fuzz/$name
  dict=()
  [ -f "$src/tests/fuzz/${name#fuzz_}.dict" ] && dict=(-dict="$src/tests/fuzz/${name#fuzz_}.dict")
  mkdir -p "$work/$name/live"
  cp "$src/tests/fuzz/corpus/$name"/* "$work/$name/live/"
  (cd "$work/$name" && "$bin" -runs="$runs" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 "${dict[@]}" live \
      >"$work/$name.log" 2>&1) || { echo "FAIL $name: see $work/$name.log"; tail -30 "$work/$name.log"; exit 1; }
  done_runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name.log")
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$work/$name.log")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$work/$name.log" | tail -1)
  mkdir -p "$work/$name/min"
  "$bin" -merge=1 "$work/$name/min" "$work/$name/live" >"$work/$name.merge.log" 2>&1
  # Named seeds (regression inputs, hand-written cases) stay by name; the rest is the minimised set.
  mkdir -p "$work/$name/named"
  find "$src/tests/fuzz/corpus/$name" -type f -regextype posix-extended ! -regex '.*/[0-9a-f]{40}' -exec cp {} "$work/$name/named/" \;
  rm -rf "$src/tests/fuzz/corpus/$name" && mkdir "$src/tests/fuzz/corpus/$name"
  cp "$work/$name/min"/* "$work/$name/named"/* "$src/tests/fuzz/corpus/$name/" 2>/dev/null || true
  echo "$name: $done_runs executions in ${secs:-?} s, $cov, corpus minimised to $(ls "$work/$name/min" | wc -l) inputs"
done
echo "done; $(uptime)"
