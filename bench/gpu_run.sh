#!/bin/bash
# The GPU test and benchmark, for a CUDA machine that has torch but neither a compiler nor
# Debian's hwloc and libnuma.
#
#   bench/gpu_run.sh prepare     here: build the default preset and gather what the GPU machine
#                                needs into build/gpu (libzenbind, zenflow-optimizer, Debian's
#                                libhwloc15, libnuma1, libgomp1, libudev1 unpacked by dpkg -x)
#   bench/gpu_run.sh [test|bench|cpu|all] [ARGS]
#                                there, from the repository root, with $PYTHON (else python3)
#                                that has torch: tests/python/test_gpu.py, bench/gpu_offload.py
#                                ARGS, and (cpu) that machine's CPU: the kernel against its
#                                roofline and against torch's fused AdamW, on one core and all
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu

prepare() {
    cmake --preset default >/dev/null
    cmake --build build/default -j"$(nproc)" --target zenbind zenflow-optimizer zenflow-bench
    rm -rf "$out" && mkdir -p "$out/debs"
    cp -L build/default/libzenbind/libzenbind.so.2 build/default/optimizer/zenflow-optimizer \
        build/default/bench/zenflow-bench "$out/"
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
        (cd tests/python && "${PYTHON:-python3}" test_gpu.py -v)
    fi
    if [ "$what" = bench ] || [ "$what" = all ]; then
        "${PYTHON:-python3}" bench/gpu_offload.py "$@"
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

case ${1:-all} in
prepare) prepare ;;
test | bench | cpu | all) run "${1:-all}" "${@:2}" ;;
*) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
