# shellcheck shell=bash
# What the package tests share, sourced first: strict mode, the SONAME's number where
# CMakeLists.txt sets it (libzenbindN holds libzenbind.so.N), and a scratch directory `work`
# removed on exit (a test with more to clean up sets its own EXIT trap, which removes it too).
set -euo pipefail
# shellcheck disable=SC2034 # used by the scripts that source this
so=$(sed -n 's/^set(ZB_SOVERSION \([0-9]*\)).*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../../CMakeLists.txt")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
