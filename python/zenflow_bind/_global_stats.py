"""The decisions a step makes over every gradient (skip_nonfinite, max_grad_norm, grad_norm) when
the parameters are sharded (FSDP2's DTensors): each rank holds a part of each gradient, so its
own kernel's pre-pass would see a part of the norm and decide alone (one rank skipping a step the
others take tears the model). Here each rank counts its parts as the kernels' pre-pass does (each
product rounded to fp32, the squares summed in double) and the counts are summed over the mesh
dimensions the parameters are sharded on, as torch's clip_grad_norm_ does with DTensors, so
every rank takes the same decision. The counting is libzenbind's zb_adam_grad_stats (the kernels'
pre-pass itself, on the caller's threads) for CPU gradients it can read; torch's operations for
the others."""

import ctypes
import math

import torch

from . import _native
from ._layout import DTYPE_NAMES, local
from .functional import adam_args, tensor_array


def sharded(params):
    """Whether any of these parameters is a DTensor."""
    return any(local(p) is not p for p in params)


def complete_grads(params):
    """Tensor parallelism without FSDP2 leaves a DTensor gradient placed otherwise than its
    parameter (Partial(sum) for a Replicate norm weight under SequenceParallel): each rank holds
    its share of a sum. torch's optimizers step what it sums to, and so does the step, once it is
    redistributed to its parameter's placements here. A collective: every rank calls this first
    in step(), over the same parameters in the same order. (FSDP2 reduces them itself.)"""
    for p in params:
        if local(p) is p:
            continue
        g = p.grad
        if g is not None and local(g) is not g and g.placements != p.placements:
            p.grad = g.redistribute(p.device_mesh, p.placements)


def _shard_dims(p):
    """(mesh, the mesh dimensions p is sharded on), or None for a plain tensor."""
    if local(p) is p:
        return None
    dims = tuple(i for i, place in enumerate(p.placements) if place.is_shard())
    return p.device_mesh, dims


def _native_sums(grads, scale, threads):
    """[sum of squares, non-finite] of CPU contiguous gradients of one dtype, by the pre-pass."""
    args = adam_args(grads[0].dtype, scale, threads)
    native = tensor_array((0, g.data_ptr(), 0, 0, 0, g.numel(), 0, 0) for g in grads)
    out = _native.GradStats()
    _native.check(_native.library().zb_adam_grad_stats(native, len(grads), ctypes.byref(args),
                                                       ctypes.byref(out)))
    return [out.sum_squares, out.nonfinite]


def _sums(grads, scale, threads):
    """[sum of squares, non-finite] of these gradients times scale."""
    total = [0.0, 0]
    readable = {}  # dtype -> CPU contiguous gradients the library reads
    for g in grads:
        if g.device.type == "cpu" and g.dtype in DTYPE_NAMES and g.is_contiguous():
            readable.setdefault(g.dtype, []).append(g)
            continue
        x = g.float() * scale
        total[0] += float(x.double().square().sum())
        total[1] += int((~torch.isfinite(x)).sum())
    for same in readable.values():
        part = _native_sums(same, scale, threads)
        total[0] += part[0]
        total[1] += part[1]
    return total


def stats(params, grads, scale, threads):
    """(non-finite count, sum of squares) of every gradient times scale over all ranks. params:
    every parameter of the optimizer, in the same order on every rank (each sharded one takes
    part in a collective, with a gradient here or not); grads: {id(param): its local gradient
    as stepped}; threads: how many this process counts with."""
    plain = []
    parts = {}  # (id(mesh), dims) -> [mesh, dims, its gradients], first-seen order
    for p in params:
        where = _shard_dims(p)
        if where is None:
            acc = plain
        else:
            acc = parts.setdefault((id(where[0]), where[1]), [where[0], where[1], []])[2]
        g = grads.get(id(p))
        if g is not None and g.numel():
            acc.append(g)
    sum_squares, nonfinite = _sums(plain, scale, threads)
    if parts:
        import torch.distributed as dist
        for mesh, dims, part in parts.values():
            part_squares, part_nonfinite = _sums(part, scale, threads)
            t = torch.tensor([part_squares, float(part_nonfinite)], dtype=torch.float64,
                             device=mesh.device_type)
            for d in dims:
                dist.all_reduce(t, group=mesh.get_group(d))
            sum_squares += float(t[0])
            nonfinite += int(t[1])
    return nonfinite, sum_squares


def clip_scale(max_grad_norm, sum_squares):
    """The factor max_grad_norm clips by, rounded to fp32 as the kernels' clip_coefficient()."""
    q = max_grad_norm / (math.sqrt(sum_squares) + 1e-6)
    return float(torch.tensor(1.0 if q >= 1.0 else q, dtype=torch.float32))
