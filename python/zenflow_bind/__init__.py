"""zenflow-bind's Python side.

zenflow_bind.optim.AdamW is a torch.optim.Optimizer whose step runs in a zenflow-optimizer worker
(import it from there; this package does not import torch). Worker and Group are the ctypes
binding of libzenbind's worker API (zenbind/worker.h) under it: a Worker spawns zenflow-optimizer
(pinned, NUMA-local Adam in another process); each parameter group lives in shared memory and is
exposed as numpy arrays that alias it. Every libzenbind error raises ZenbindError.

    with Worker(threads=2) as w:
        g = w.add_group(numel, grad="bf16", copy_out="bf16", lr=1e-3, weight_decay=0.01)
        g.params[:] = flat_params
        g.grads[0][:] = flat_grads            # buffer 0, while the worker may be busy with 1
        w.submit(step=1, grad_buffer=0)
        ...                                   # forward/backward of the next step
        w.wait(timeout_ms=10_000)

The library is found through $ZENFLOW_BIND_LIB, else the copy `pip install ./python`
bundled in zenflow_bind/_lib, else the system's libzenbind.so.2 (_native.library_path); the
worker executable through the path argument, else $ZENFLOW_OPTIMIZER, else the bundled copy,
else libzenbind's default (_native.optimizer_path).
"""

from ._native import STEP_GRAD_NORM, STEP_SKIP_NONFINITE, ZenbindError, library
from .worker import Group, StepResult, Worker

__all__ = ["ZenbindError", "Worker", "Group", "StepResult", "library", "STEP_SKIP_NONFINITE",
           "STEP_GRAD_NORM"]


def __getattr__(name):
    # __version__ is the library's (zb_version): the packages install both at one version and
    # pip bundles them, so the library in use is what the version describes. Loaded on first use;
    # without a library, the installed metadata's, else none (AttributeError, as hasattr expects).
    if name == "__version__":
        try:
            return library().zb_version().decode()
        except (OSError, ZenbindError) as e:
            from importlib import metadata
            try:
                return metadata.version("zenflow-bind")
            except metadata.PackageNotFoundError:
                raise AttributeError(f"zenflow_bind.__version__: {e}") from e
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
