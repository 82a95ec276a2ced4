#!/usr/bin/env bash
# Fails when a C or C++ source of the project is not clang-format'd (.clang-format at the root).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp')
[ ${#files[@]} -eq 0 ] && exit 0
clang-format --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
