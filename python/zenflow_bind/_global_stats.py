"""The decisions a step makes over every gradient (skip_nonfinite, max_grad_norm, grad_norm) when
the parameters are sharded (FSDP2's DTensors): each rank holds a part of each gradient, so its
own kernel's pre-pass would see a part of the norm and decide alone (one rank skipping a step the
others take tears the model). Here each rank counts its parts as the kernels' pre-pass does (each
product rounded to fp32, the squares summed in double) and the counts are summed over the mesh
dimensions the parameters are sharded on, as torch's clip_grad_norm_ does with DTensors, so
every rank takes the same decision."""

import math

import torch

from ._layout import local


def sharded(params):
    """Whether any of these parameters is a DTensor."""
    return any(local(p) is not p for p in params)


def _shard_dims(p):
    """(mesh, the mesh dimensions p is sharded on), or None for a plain tensor."""
    if local(p) is p:
        return None
    dims = tuple(i for i, place in enumerate(p.placements) if place.is_shard())
    return p.device_mesh, dims


def stats(params, grads, scale):
    """(non-finite count, sum of squares) of every gradient times scale over all ranks. params:
    every parameter of the optimizer, in the same order on every rank (each sharded one takes
    part in a collective, with a gradient here or not); grads: {id(param): its local gradient
    as stepped}."""
    plain = [0.0, 0]
    parts = {}  # (id(mesh), dims) -> [mesh, dims, sum of squares, non-finite], first-seen order
    for p in params:
        where = _shard_dims(p)
        if where is None:
            acc = plain
        else:
            entry = parts.setdefault((id(where[0]), where[1]), [where[0], where[1], 0.0, 0])
            acc = entry
        g = grads.get(id(p))
        if g is None or g.numel() == 0:
            continue
        x = g.float() * scale
        total, nonfinite = float(x.double().square().sum()), int((~torch.isfinite(x)).sum())
        if acc is plain:
            plain[0] += total
            plain[1] += nonfinite
        else:
            acc[2] += total
            acc[3] += nonfinite
    sum_squares, nonfinite = plain
    if parts:
        import torch.distributed as dist
        for mesh, dims, part_squares, part_nonfinite in parts.values():
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
