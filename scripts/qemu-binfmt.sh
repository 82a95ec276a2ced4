#!/usr/bin/env bash
# Lets the kernel run arm64 programs through qemu-aarch64-static (binfmt_misc), so that the
# cross build's tests can start its programs as a user would: the tests exec the optimizer
# worker, and the Python tests run zenbind and zenflow-bench. Registers the interpreter with the
# F flag (opened now, so it works in any mount namespace), once: a handler that already matches
# arm64 ELF files, Debian's own among them, is kept. Needs root.
set -euo pipefail
dir=/proc/sys/fs/binfmt_misc
qemu=$(command -v qemu-aarch64-static) || { echo "qemu-binfmt: qemu-aarch64-static is not installed (scripts/install-deps.sh)" >&2; exit 1; }
[ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir" ||
    { echo "qemu-binfmt: cannot mount binfmt_misc on $dir" >&2; exit 1; }
magic=7f454c460201010000000000000000000200b700
for entry in "$dir"/*; do
    case ${entry##*/} in register | status) continue ;; esac
    grep -q '^enabled' "$entry" && grep -q "^magic $magic" "$entry" && exit 0
done
# Ours, left disabled by an earlier run: enable it (registering the name again would fail).
[ -e "$dir/zb-qemu-aarch64" ] && { echo 1 >"$dir/zb-qemu-aarch64"; exit 0; }
printf '%s' ":zb-qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:$qemu:F" >"$dir/register"
echo "qemu-binfmt: arm64 programs run through $qemu" >&2
