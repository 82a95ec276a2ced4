#!/usr/bin/env bash
# The kernels give the same bits on two architectures: the digest of every result of every
# kernel configuration (test_adam --digest) from this build's test_adam, run under qemu-user on
# CPUs without SVE and with SVE vectors of 128, 256 and 2048 bits, equals the digest of the
# build machine's own test_adam (x86-64: scalar, AVX2, AVX-512).
#   adam_digest_cross.sh NATIVE_TEST_ADAM CROSS_TEST_ADAM EMULATOR
set -euo pipefail
native=$1 cross=$2 emulator=$3
. "$(dirname "$0")/../skip.sh"
[ -x "$native" ] || skip "no native test_adam at $native (build the default preset first)"
want=$("$native" --digest)
echo "native: $(echo $want)"
reference=$(echo "$want" | awk '$1 == "scalar" { print $2 }')
[ -n "$reference" ] || { echo "FAIL: no scalar digest from $native" >&2; exit 1; }
echo "$want" | awk -v r="$reference" '$2 != r { bad = 1 } END { exit bad }' ||
    { echo "FAIL: the native ISAs disagree" >&2; exit 1; }
status=0
for cpu in cortex-a57 max,sve128=on max,sve256=on max,sve2048=on,sve-default-vector-length=256; do
    got=$(QEMU_CPU=$cpu "$emulator" "$cross" --digest)
    echo "QEMU_CPU=$cpu: $(echo $got)"
    while read -r isa digest; do
        if [ "$digest" != "$reference" ]; then
            echo "FAIL: $isa under QEMU_CPU=$cpu gives $digest, the native scalar kernel $reference" >&2
            status=1
        fi
    done <<< "$got"
    [ "$(echo "$got" | wc -l)" -ge 2 ] || { echo "FAIL: no vector kernel ran under $cpu" >&2; status=1; }
done
exit $status
