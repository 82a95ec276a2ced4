"""torch's GradScaler and our step (torch >= 2.0: torch.cuda.amp.GradScaler, torch.amp's from 2.3).

GradScaler.step(opt), for an optimizer whose _step_supports_amp_scaling is true, sets two
attributes on it around opt.step() instead of unscaling the gradients itself: grad_scale, the
loss scale the gradients still carry (None when unscale_() already divided them in place), and
found_inf, nonzero when a gradient is inf or NaN. torch's fused AdamW then unscales inside its
kernel and skips the step on found_inf; so does ours: the multiplier joins grad_scale, and a
skipped step updates nothing and counts nothing.

Without this the scaler unscaled in place with an op that leaves the gradients' version counter
alone, so a gradient the backward hook had already copied into the worker's buffer (a CUDA one,
or one converted in a group of mixed dtypes) was stepped still scaled."""

import functools
import inspect
from collections import namedtuple

import torch


def hands_attributes(scaler_class):
    """Whether this GradScaler's step() sets grad_scale and found_inf on an optimizer whose
    _step_supports_amp_scaling is true (torch 2.0 on); torch 1.13's passes itself as a
    grad_scaler argument instead, which our step() does not take. Read from its code: a scaler
    without CUDA (before torch.amp's, 2.3) is disabled and never calls step() that way."""
    try:
        return "optimizer.found_inf" in inspect.getsource(scaler_class.step)
    except (OSError, TypeError):  # no source to read: torch.amp's is sure to
        return hasattr(getattr(torch, "amp", None), "GradScaler")


SUPPORTED = hands_attributes(torch.cuda.amp.GradScaler)

ScalerStep = namedtuple("ScalerStep", "multiplier skip")


def scaler_step(optimizer):
    """What GradScaler.step() asks of this step, or None outside it: the multiplier of every
    gradient (None: unscale_() divided them in place already, so copies made before are stale)
    and whether to skip it."""
    found_inf = getattr(optimizer, "found_inf", None)
    if found_inf is None:
        return None
    scale = getattr(optimizer, "grad_scale", None)
    return ScalerStep(None if scale is None else 1.0 / float(scale), bool(float(found_inf)))


def skipped(optimizer):
    """Record a step GradScaler skipped: nothing stepped, nothing counted."""
    optimizer.last_step_skipped, optimizer.last_nonfinite = True, None
    optimizer.last_grad_norm, optimizer.last_step_seconds = None, 0.0


def forget(optimizer):
    """Drop what GradScaler set: it deletes the two attributes only after a step() that
    returned, and multiplies a grad_scale it finds into the next one."""
    for name in ("grad_scale", "found_inf"):
        optimizer.__dict__.pop(name, None)


def forgotten_on_error(step):
    """step, leaving no GradScaler attribute behind when it raises."""
    @functools.wraps(step)
    def wrapped(optimizer, *args, **kwargs):
        try:
            return step(optimizer, *args, **kwargs)
        except BaseException:
            forget(optimizer)
            raise
    return wrapped


def scaler_mismatch(amp, given, taken):
    """Why GradScaler's step does not fit a step_during_backward() given grad_scale `given`
    (`taken`: some buckets already stepped with it)."""
    taken = f"(the step was taken with {given})" if taken else "(no step was taken)"
    if amp.multiplier is None:  # unscale_() ran
        return (f"GradScaler.unscale_() after step_during_backward(grad_scale={given}) {taken}: "
                f"do not unscale the gradients, give step_during_backward(grad_scale=1 / "
                f"scaler.get_scale()) instead")
    return (f"GradScaler's scale is 1/{1 / amp.multiplier:g}, but step_during_backward() was "
            f"given grad_scale={given} {taken}: give it grad_scale=1 / scaler.get_scale()")
