"""One optimizer step through an installed zenflow_bind alone, as a user runs it: no ZENFLOW_*
variable, no PYTHONPATH into the source tree. Checks where the package, its library and its
worker were found, then that the step applied the update.

    installed_step.py MODULE_PREFIX [--bundled]   (--bundled: library and worker inside it)"""
import os
import sys
from importlib import metadata

import numpy as np

import zenflow_bind
from zenflow_bind import _native

prefix, bundled = sys.argv[1], "--bundled" in sys.argv[2:]
here = os.path.dirname(zenflow_bind.__file__)
assert here.startswith(prefix), f"zenflow_bind imported from {here}, not under {prefix}"
lib, worker = _native.library_path(), _native.optimizer_path()
if bundled:
    assert lib.startswith(here), f"library {lib} is not the package's own"
    assert worker and worker.startswith(here), f"worker {worker} is not the package's own"
# pip and importlib.metadata see the version installed, the library's own
assert metadata.version("zenflow-bind") == zenflow_bind.__version__, \
    (metadata.version("zenflow-bind"), zenflow_bind.__version__)
with zenflow_bind.Worker(threads=1) as w:
    g = w.add_group(1000, lr=0.1, weight_decay=0.0)
    g.params[:] = 1.0
    g.grads[0][:] = 1.0
    w.step(step=1)
    assert np.allclose(g.params, 0.9), g.params[:4]
print(f"ok   zenflow-bind {zenflow_bind.__version__}: a worker step from {here} (library {lib}, "
      f"worker {worker or 'the default'})")
