"""What torch.compile makes of our calls: it runs them as they are, outside any graph.

A step is a call into the zenflow-optimizer worker or into libzenbind's kernel through ctypes,
nothing a graph can hold; so is a backward hook that copies a gradient into the worker's buffer.
Left to trace them, dynamo broke the graph at each .item(), data_ptr() comparison or ctypes call
inside, with a warning for some, and traced the Python around them again at every recompile.
torch.compiler.disable (torch >= 2.1) makes each call one clean graph break; before it there is
no torch.compile to leave."""

import contextlib
import functools

import torch


def eager(fn):
    """fn, run eagerly under torch.compile (and as it is where torch has no torch.compiler).
    torch._disable_dynamo is what torch.optim.Optimizer's own methods use: it imports dynamo at
    the first call, not here (0.6-0.9 s that a run which never compiles need not spend)."""
    if getattr(torch, "compiler", None) is None:
        return fn
    disable = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable
    return disable(fn)


class _Eager(contextlib.ContextDecorator):
    """A context manager whose entry and exit run eagerly (dynamo cannot trace a generator);
    a decorator too, as contextlib's are."""

    def __init__(self, manager):
        self._manager = manager

    def _recreate_cm(self):  # ContextDecorator's hook: a fresh manager for each decorated call
        return _Eager(self._manager._recreate_cm())

    @eager
    def __enter__(self):
        return self._manager.__enter__()

    @eager
    def __exit__(self, *exc):
        return self._manager.__exit__(*exc)


def eager_context(generator):
    """contextlib.contextmanager(generator), entered and left eagerly under torch.compile."""
    manager = contextlib.contextmanager(generator)

    @functools.wraps(generator)
    def make(*args, **kwargs):
        return _Eager(manager(*args, **kwargs))
    return eager(make)
