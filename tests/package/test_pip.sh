#!/usr/bin/env bash
# `pip install contrib/python` into a fresh virtual environment of Debian's python3, offline, then
# the installed package alone (no ZENFLOW_* variable, run outside the source tree) starts a worker
# and runs a step with its own libzenbind and zenflow-optimizer.   usage: test_pip.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-index --no-cache-dir --quiet \
  --config-settings=build-dir="$work/build" "$src/contrib/python"
cd "$work"
env -u ZENFLOW_BIND_LIB -u ZENFLOW_OPTIMIZER -u PYTHONPATH "$work/venv/bin/python" - <<'PY'
import os
import numpy as np
import zenflow_bind
from zenflow_bind import _native

here = os.path.dirname(zenflow_bind.__file__)
lib, worker = _native.library_path(), _native.optimizer_path()
assert lib.startswith(here), f"library {lib} is not the package's own"
assert worker.startswith(here), f"worker {worker} is not the package's own"
with zenflow_bind.Worker(threads=1) as w:
    g = w.add_group(1000, lr=0.1, weight_decay=0.0)
    g.params[:] = 1.0
    g.grads[0][:] = 1.0
    w.step(step=1)
    assert np.allclose(g.params, 0.9), g.params[:4]
print(f"ok   pip-installed package: {lib}, {worker}")
PY
