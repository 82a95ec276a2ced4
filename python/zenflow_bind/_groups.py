"""torch param groups and state dicts as both zenflow_bind.optim.AdamW classes take them: what a
group may hold (checked before anything changes), torch.optim.AdamW's keys for the saved groups,
so that a checkpoint moves both ways, and torch's load_state_dict hooks."""

import collections.abc
import contextlib

import torch

from .functional import checked_hyper

_WHY_NOT = {
    "amsgrad": "amsgrad=True is not supported: its running maximum of the second moment would "
               "be a fourth state stream in the worker (4 more bytes per parameter to keep, 8 "
               "more to move at every memory-bound step)",
    "capturable": "capturable=True is not supported: the step is a CPU kernel (in the worker, or "
                  "in this process with worker=False), which a CUDA graph cannot capture",
    "differentiable": "differentiable=True is not supported: the step writes the tensors through "
                      "their memory (in the worker, or in this process with worker=False), "
                      "outside autograd",
}


def check_group(group):
    """Refuse what would change the math or cannot be done, with the reason."""
    for key, why in _WHY_NOT.items():
        if group.get(key):
            raise ValueError(why)
    checked_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"],
                  adamw_of(group), corrected(group))


def check_unique(group):
    """torch only warns of a parameter listed twice in one group (to be an error); stepping it
    twice a step, or once with two step counts, is never what was meant."""
    seen = set()
    for i, p in enumerate(group["params"]):
        if id(p) in seen:
            raise ValueError(f"parameter {i} of the param group is listed twice in it: list each "
                             "parameter once")
        seen.add(id(p))


_TORCH_GROUP_KEYS = []  # the keys of this torch's torch.optim.AdamW param groups, once known


def _torch_group_keys():
    if not _TORCH_GROUP_KEYS:
        probe = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        _TORCH_GROUP_KEYS.append(frozenset(probe.param_groups[0]) - {"params"})
    return _TORCH_GROUP_KEYS[0]


# A group says AdamW or Adam with L2, and whether to correct the bias, in torch.optim.AdamW's
# keys: decoupled_weight_decay where this torch's AdamW has it (2.14 does, 2.6 does not), and the
# DeepSpeed-style adamw_mode and bias_correction only when they differ from torch's math (False).
# Live groups hold exactly the keys their state dicts save, which DCP needs: its load looks up
# every key of the optimizer's groups in the checkpoint (flatten_optimizer_state_dict=True).
MATH_KEYS = ("adamw_mode", "decoupled_weight_decay", "bias_correction")


def _flag(key, value):
    """A group's True or False: anything equal to one of them (1, numpy's or a one-element
    tensor's bool); None or a string is refused, not taken for one."""
    if value is not None and not isinstance(value, (str, bytes)):
        try:
            flag = bool(value)
            if value == flag:
                return flag
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"{key} must be True or False, not {value!r} ({type(value).__name__})")


def adamw_of(group, default=True):
    """AdamW (True) or Adam with L2: adamw_mode where a user set it, else
    decoupled_weight_decay, else default."""
    for key in ("adamw_mode", "decoupled_weight_decay"):
        if key in group:
            return _flag(key, group[key])
    return default


def corrected(group, default=True):
    if "bias_correction" in group:
        return _flag("bias_correction", group["bias_correction"])
    return default


def set_math(group, adamw, correct):
    """Put adamw and correct into group in the keys its state dict saves (in place)."""
    adamw, correct = _flag("adamw_mode", adamw), _flag("bias_correction", correct)
    for key in MATH_KEYS:
        group.pop(key, None)
    if "decoupled_weight_decay" in _torch_group_keys():
        group["decoupled_weight_decay"] = adamw
    elif not adamw:
        group["adamw_mode"] = False
    if not correct:
        group["bias_correction"] = False
    return group


def only_torch_flags(group):
    """group without the execution flags this torch's AdamW lacks (torch 1.13's has no fused
    nor differentiable), in place, so that the groups hold exactly its keys."""
    for key in ("fused", "differentiable"):
        if key not in _torch_group_keys():
            group.pop(key, None)
    return group


def group_math(group, defaults):
    """(adamw, correct) of a group; what it does not say comes from defaults (an optimizer's:
    read before torch's add_param_group fills the group from them)."""
    if not isinstance(group, dict):  # torch's add_param_group says what it must be
        group = {}
    return adamw_of(group, adamw_of(defaults)), corrected(group, corrected(defaults))


def in_torch_keys(group):
    """group with its math in the keys its state dict saves (in place); what it does not say is
    torch's math."""
    return set_math(group, *group_math(group, {}))


def as_torch_groups(groups):
    """Param groups in torch.optim.AdamW's keys (in place), so that a checkpoint moves both
    ways under DCP's strict key match: the optimizer's own before its state dict is taken (a
    user may have set adamw_mode in one since), and so the state dict's copies of them."""
    for g in groups:
        in_torch_keys(g)
    return groups


# How torch's AdamW ran, not what it computed or saved: a checkpoint of one that ran so loads here,
# and the groups keep this optimizer's (False)
_EXECUTION_KEYS = ("capturable", "differentiable")


def _from_saved(saved):
    """A saved param group's settings in this optimizer's keys; what a group saved by
    torch.optim.AdamW lacks is torch's math."""
    return in_torch_keys({k: v for k, v in saved.items()
                          if k != "params" and k not in _EXECUTION_KEYS})


def apply_saved(group, update):
    """A live group takes a saved one's settings (read_saved): its math only as saved."""
    for key in MATH_KEYS:
        group.pop(key, None)
    group.update(update)
    for key in _EXECUTION_KEYS:  # (torch's own load, worker=False's, put the saved ones there)
        if key in group:
            group[key] = False


def read_saved(param_groups, state_dict):
    """A state dict's param groups, its state and each group's new settings, checked against
    param_groups; nothing is changed here."""
    try:
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    except (KeyError, TypeError):
        raise ValueError("a state dict has 'state' and 'param_groups'") from None
    if not isinstance(saved_groups, (list, tuple)) or \
            not isinstance(saved_state, collections.abc.Mapping):
        raise TypeError(f"a state dict's 'param_groups' is a list and its 'state' a dict, not "
                        f"a {type(saved_groups).__name__} and a {type(saved_state).__name__}")
    if len(saved_groups) != len(param_groups):
        raise ValueError(f"the state dict has {len(saved_groups)} param groups, this optimizer "
                         f"{len(param_groups)}")
    updates, maximize = [], set()
    for i, (group, saved) in enumerate(zip(param_groups, saved_groups)):
        if not isinstance(saved, collections.abc.Mapping) or \
                not isinstance(saved.get("params"), (list, tuple)):
            raise ValueError(f"param group {i} of the state dict is not a dict with a 'params' "
                             "list")
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"param group {i} has {len(group['params'])} parameters, the state "
                             f"dict's {len(saved['params'])}")
        missing = [k for k in ("lr", "betas", "eps", "weight_decay") if k not in saved]
        if missing:  # (torch's AdamW loads it and fails at the next step)
            raise ValueError(f"param group {i} of the state dict has no {', '.join(missing)}: "
                             "not the state dict of an Adam or AdamW")
        update = _from_saved(saved)
        check_group({**group, **update})
        updates.append(update)
        maximize.add(bool({**group, **update}.get("maximize", False)))
    if len(maximize) > 1:  # (torch's AdamW takes it: every step() here would refuse it)
        raise ValueError("maximize differs between the state dict's param groups: this "
                         "optimizer negates every gradient of a step at once, in every group")
    return saved_groups, saved_state, updates


def saved_entry(saved_state, key, where):
    """A parameter's entry in a state dict's 'state': None for no state, else a dict."""
    entry = saved_state.get(key)
    if entry is None:
        return None
    if not isinstance(entry, collections.abc.Mapping):
        raise TypeError(f"{where}: its state is a {type(entry).__name__}, not a dict")
    return entry or None


@contextlib.contextmanager
def _in_load_hooks(optimizer):
    """While they run, the hooks may call optimizer.state_dict() (AdamW._reading_state): before
    the load has changed anything, or after all of it."""
    optimizer._in_load_hooks = True
    try:
        yield
    finally:
        optimizer._in_load_hooks = False


def load_pre_hooks(optimizer, state_dict):
    """The state dict torch's load_state_dict pre-hooks (torch >= 2.1) make of state_dict: each
    may return a new one, or change the shallow copy they get, as torch's do."""
    state_dict = state_dict.copy()
    with _in_load_hooks(optimizer):
        for hook in getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", {}).values():
            out = hook(optimizer, state_dict)
            if out is not None:
                state_dict = out
    return state_dict


def load_post_hooks(optimizer):
    with _in_load_hooks(optimizer):
        for hook in getattr(optimizer, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(optimizer)
