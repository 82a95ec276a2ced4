#!/usr/bin/env bash
# `pip install ./python` into a fresh virtual environment of Debian's python3, offline, then
# the installed package alone (no ZENFLOW_* variable, run outside the source tree) starts a worker
# and runs a step with its own libzenbind and zenflow-optimizer.   usage: test_pip.sh SOURCE_DIR
. "$(dirname "$0")/common.sh"
src=$1

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-index --no-cache-dir --quiet \
  --config-settings=build-dir="$work/build" "$src/python"
cd "$work"
env -u ZENFLOW_BIND_LIB -u ZENFLOW_OPTIMIZER -u PYTHONPATH \
  "$work/venv/bin/python" "$src/tests/package/installed_step.py" "$work/venv" --bundled
