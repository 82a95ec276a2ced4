#!/usr/bin/env bash
# zenflow's fp32 AdamW step against DeepSpeed's cpu_adam step in ONE process, alternated step by
# step (deepspeed_pair.cpp): the ratio holds when the machine's memory speed drifts, which the
# two-process comparison of the DeepSpeed harness cannot promise. DeepSpeed's code comes from the
# harness directory (../shared/anchors/deepspeed-cpu-adam after its get-src.sh), never from here;
# it is compiled with the flags DeepSpeed's op builder uses on this CPU.
#   usage: bench/deepspeed_pair.sh HARNESS_DIR [ELEMENTS]      (from the source tree)
#   env:   ZB_BUILD (build/default, built), THREADS ("1 2"), ROUNDS (3), STEPS (30),
#          ISA (avx512 or avx2: both sides' vector width; default the widest this CPU has)
set -euo pipefail
harness=$(cd "${1:?usage: bench/deepspeed_pair.sh HARNESS_DIR [ELEMENTS]}" && pwd)
n=${2:-100000000}
src=$(cd "$(dirname "$0")/.." && pwd)
build=${ZB_BUILD:-$src/build/default}
[ -f "$build/optimizer/libzbadam.a" ] || { echo "no $build/optimizer/libzbadam.a: build zenflow first" >&2; exit 2; }
[ -f "$harness/src/csrc/includes/cpu_adam.h" ] || { echo "no DeepSpeed sources in $harness/src: run its get-src.sh" >&2; exit 2; }
[ -f "$harness/src/derived/ds_step_kernels.inc" ] || "$harness/extract.sh"
isa=${ISA:-$(grep -qw avx512f /proc/cpuinfo && echo avx512 || echo avx2)}
# For AVX2, DeepSpeed's code gets no AVX-512 either (-march=native would give its 256-bit code 32
# registers and AVX-512 tails on a CPU that has it), as on a machine without AVX-512.
simd=$([ "$isa" = avx512 ] && echo -D__AVX512__ || echo "-D__AVX256__ -mno-avx512f")
bin=$(mktemp /tmp/zb-deepspeed-pair.XXXXXX)
trap 'rm -f "$bin"' EXIT
# DeepSpeed's cpu_adam flags (op_builder: -O3 -std=c++17 -g -march=native -fopenmp, its SIMD width);
# C++20 for zenflow's header, -Wno-* only for DeepSpeed's own code.
g++ -O3 -std=c++20 -g -march=native -fopenmp $simd -D__ENABLE_CUDA__ -fPIC -Wno-reorder \
    -Wno-unknown-pragmas -I"$harness/shim" -I"$harness/src/csrc/includes" -I"$harness/src/derived" \
    -I"$src/optimizer/include" -I"$src/bench" "$src/bench/deepspeed_pair.cpp" "$build/optimizer/libzbadam.a" -o "$bin"
status=0
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) | $(nproc) CPUs | DeepSpeed $(cut -c1-12 "$harness/src/DS_COMMIT") | zenflow $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?') | $isa"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for t in ${THREADS:-1 2}; do
    for r in $(seq "${ROUNDS:-3}"); do
        # a run whose results disagree fails the script, after the other runs
        OMP_NUM_THREADS=$t OMP_PROC_BIND=close OMP_PLACES=cores "$bin" "$n" "$t" "${STEPS:-30}" \
            "$isa" || status=1
    done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
