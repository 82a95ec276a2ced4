"""optimizer.state of zenflow_bind.optim.AdamW: the worker's per-parameter state in torch's format,
brought out when it is read, and what was written into it taken back.

The Adam moments live only in the worker (private, on the optimizer CPUs' NUMA node). Copying them
out at every step would add 16 bytes of memory traffic per parameter to a memory-bound step, so
optimizer.state is a snapshot: taken the first time it is read after a step (by DCP's
get_optimizer_state_dict, state_dict(), a user's loop), kept while nothing steps, and dropped at
the next step, which first sends the worker whatever was written into it (in place or by
assignment). torch code that reads optimizer.state sees exactly what torch.optim.AdamW would
hold: nothing before a parameter's first step, then step, exp_avg, exp_avg_sq (and master_param
for a 16-bit parameter), as DTensors sharded like their parameter under FSDP2. A snapshot's
moments are copied once out of the worker into memory of their own that the entries view (8 bytes
per parameter, freed with the last tensor viewing it), and never again."""

import collections
import math

import torch

from ._layout import local

def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    return DTensor


def _like_param(view, slot):
    """A flat slice of a group buffer shaped as the parameter: a DTensor placed as the
    parameter when it is one (this rank's shard), else a plain CPU tensor."""
    if not slot.sharded:
        return view.view(slot.param.shape)
    p = slot.param
    return _dtensor_class().from_local(view.view(local(p).shape), p.device_mesh, p.placements,
                                       run_check=False, shape=p.shape, stride=p.stride())


def _empty_like(p):
    """An fp32 tensor of p's local shape (no elements here), placed as p when it is a DTensor."""
    shard = local(p)
    t = torch.zeros(shard.shape, dtype=torch.float32)
    if shard is p:
        return t
    return _dtensor_class().from_local(t, p.device_mesh, p.placements, run_check=False,
                                       shape=p.shape, stride=p.stride())


def _empty_entry(p, step):
    entry = {"step": torch.tensor(float(step)), "exp_avg": _empty_like(p),
             "exp_avg_sq": _empty_like(p)}
    if p.dtype != torch.float32:
        entry["master_param"] = _empty_like(p)
    return entry


# The keys of an AdamW state entry; the worker holds what they hold. Other keys (a library's own,
# beside them) are kept by the optimizer in this process (extras()).
ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq", "master_param")


def extras(entry):
    """The keys of a state entry that are not AdamW's, as they are."""
    return {k: v for k, v in (entry or {}).items() if k not in ADAM_KEYS}


def cast_like(param, value):
    """A loaded value of a library's key as torch's load_state_dict makes it: a floating-point
    tensor in the parameter's dtype, any tensor on its device, containers item by item."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and param.is_floating_point():
            return value.to(dtype=param.dtype, device=param.device)
        return value.to(device=param.device)
    if isinstance(value, dict):
        return {k: cast_like(param, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cast_like(param, v) for v in value)
    return value


def _version(tensor):
    """A tensor's version counters: a DTensor's own and its local shard's. An in-place op on the
    DTensor (opt.state[p]["exp_avg"].zero_() under FSDP2) counts on the first, a write through
    the shard (DCP's load) on the second."""
    shard = local(tensor)
    return (tensor._version, shard._version) if shard is not tensor else tensor._version


def _versions(entry):
    """{key: (value, version)}: what an entry holds, and each tensor's version counters."""
    return {k: (v, _version(v)) if isinstance(v, torch.Tensor) else (v, None)
            for k, v in entry.items()}


def _unchanged(entry, versions):
    """Whether entry holds the very objects `versions` recorded under AdamW's keys, no tensor
    written since (a library's keys beside them are not the worker's). By identity: comparing
    tensors with == would compare their elements."""
    mine = {k for k in entry if k in ADAM_KEYS}
    if mine != {k for k in versions if k in ADAM_KEYS}:
        return False
    for key in mine:
        value = entry[key]
        old, version = versions[key]
        if value is not old:
            return False
        if isinstance(value, torch.Tensor) and _version(value) != version:
            return False
    return True


class Snapshot:
    """optimizer.state as brought out of the worker, and how to tell what was written since."""

    def __init__(self, layouts, steps, param_groups, extra):
        self.state = collections.defaultdict(dict)
        self._taken = {}   # param -> (group index, its entry, {key: (value, version)})
        self._groups = {}  # param -> group index, for every parameter the worker holds
        self._elsewhere = []  # the parameters of groups with no element here
        for i, layout in enumerate(layouts):
            if layout is None:
                # no element here (an FSDP2 shard left empty on this rank): torch's state all the
                # same, so every rank's state dict has the same entries for DCP's collectives
                for p in param_groups[i]["params"]:
                    self._elsewhere.append(p)
                    if p in steps:
                        self.state[p] = {**_empty_entry(p, steps[p]), **extra.get(p, {})}
                    elif p in extra:
                        self.state[p] = dict(extra[p])
                continue
            for slot in layout.slots:  # a library's keys, beside the worker's state or alone
                if slot.param in extra and slot.param not in steps:
                    entry = self.state[slot.param] = dict(extra[slot.param])
                    self._taken[slot.param] = (i, entry, _versions(entry))
            for slot in layout.slots:
                self._groups[slot.param] = i
            for group, bucket in zip(layout.group.groups, layout.buckets):
                stepped = [s for s in bucket if s.param in steps]  # (step 0 included)
                if not stepped:
                    continue
                # the moments are copied once into memory that the entries then view, each
                # through a storage of its own that starts where it does: torch 2.14 cannot copy
                # or save a DTensor whose local tensor starts inside its storage
                m, v, _ = group.take_state(count=False)  # the counts are the optimizer's
                for slot in stepped:
                    cut = slice(slot.at, slot.at + slot.numel)
                    entry = {"step": torch.tensor(float(steps[slot.param])),
                             "exp_avg": _like_param(torch.from_numpy(m[cut]), slot),
                             "exp_avg_sq": _like_param(torch.from_numpy(v[cut]), slot)}
                    if slot.param.dtype != torch.float32:
                        entry["master_param"] = _like_param(slot.master.reshape(-1).clone(),
                                                            slot)
                    entry.update(extra.get(slot.param, {}))
                    self.state[slot.param] = entry
                    self._taken[slot.param] = (i, entry, _versions(entry))

    def edited_groups(self):
        """Indices of the param groups whose AdamW state was written since the snapshot was
        taken."""
        edited = set()
        for param, (i, entry, versions) in self._taken.items():
            now = self.state.get(param)
            if not _unchanged(now or {}, versions):
                edited.add(i)
        for param, entry in self.state.items():
            if param not in self._taken and param in self._groups and \
                    any(k in entry for k in ADAM_KEYS):
                edited.add(self._groups[param])
        return sorted(edited)

    def held(self):
        """(parameter, its entry now) for every parameter of the optimizer."""
        return [(p, self.state.get(p)) for p in (*self._groups, *self._elsewhere)]


def _name(keys, index):
    return f"parameter {index}" if keys is None else f"parameter {keys[index]!r}"


def _flat(value, slot, key, where):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: {key} is a {type(value).__name__}, not a tensor")
    value = local(value.detach())
    shape = local(slot.param).shape
    if value.shape != shape:  # (one of as many elements, transposed, would load scrambled)
        raise ValueError(f"{where}: {key} has shape {tuple(value.shape)}, its parameter "
                         f"{tuple(shape)} (here)")
    # contiguous: the worker is handed its memory as it is (a strided view would be refused there,
    # after the checks)
    return value.to(device="cpu", dtype=torch.float32).reshape(-1).contiguous()


_MAX_STEP = 2 ** 53


def _count(value, where):
    try:
        count = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{where}: step must be a number or a one-element tensor, not "
                        f"{value!r}") from None
    if not (math.isfinite(count) and count >= 0 and count == int(count)):
        raise ValueError(f"{where}: step must be a whole number >= 0, not {count}")
    if count > _MAX_STEP:  # (the worker takes an int64; a float holds whole numbers to 2^53)
        raise ValueError(f"{where}: step must be at most 2^53, not {count:.0f}")
    return int(count)


def saved_step(state, where):
    """The step count of a torch-format entry, None where it holds no AdamW state (None, {}, or
    only a library's keys); an entry with part of AdamW's keys is refused."""
    if state is not None and not isinstance(state, collections.abc.Mapping):
        raise TypeError(f"{where}: its state is a {type(state).__name__}, not a dict")
    if not state or not any(k in state for k in ADAM_KEYS):
        return None
    missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if k not in state]
    if missing:
        raise ValueError(f"{where}: its state has no {', '.join(missing)} (it has "
                         f"{', '.join(map(str, state)) or 'nothing'})")
    return _count(state["step"], where)


def prepare_group_state(layout, states, where, keys=None):
    """One param group's state from torch-format entries (None or {} for no state), checked
    whole before anything is changed: the moments as ranges (offset, numel, exp_avg, exp_avg_sq)
    of the group, flat fp32 (the entries' own tensors where they are that already), the steps
    (None: no state; 0 is a state, torch's after a reset) and the fp32 masters (None: take the
    model's) in slot order."""
    moments, steps, masters = [], [], []
    for index, (slot, state) in enumerate(zip(layout.slots, states)):
        here = f"{where}, {_name(keys, index)}"
        count = saved_step(state, here)
        steps.append(count)
        if count is None:
            masters.append(None)
            continue
        m = _flat(state["exp_avg"], slot, "exp_avg", here)
        v = _flat(state["exp_avg_sq"], slot, "exp_avg_sq", here)
        if slot.numel:
            moments.append((slot.offset, slot.numel, m, v))
        master = state.get("master_param")
        masters.append(None if master is None else _flat(master, slot, "master_param", here))
    return moments, steps, masters
