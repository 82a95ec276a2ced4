"""Deprecated name of zenflow_bind.optim, kept for one release: import zenflow_bind.optim."""

import warnings

from .optim import AdamW

__all__ = ["AdamW"]

warnings.warn("zenflow_bind.torch is deprecated and goes in the next release: use "
              "zenflow_bind.optim.AdamW (the same class)", FutureWarning, stacklevel=2)
