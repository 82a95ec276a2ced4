"""zenflow_bind.optim.AdamW(worker=False): the same optimizer, stepping in this process.

For an optimizer that runs where training runs (srun --zenflow-bind=mode=offload, FSDP2's
CPUOffloadPolicy): no worker, no shared memory. optimizer.state is torch's own dict, filled as
torch.optim.AdamW fills it (step, exp_avg, exp_avg_sq, and master_param for a 16-bit parameter;
DTensors for DTensor parameters), so torch's state_dict, hooks and distributed checkpoints work on
it directly; each step is one zb_adam_step (functional.launch) over every parameter with a
gradient, on this process's threads. The format is the worker's, so a checkpoint moves between
the modes."""

import contextlib
import ctypes
import math
import threading
import weakref

import torch

from . import _ddp, _native
from ._amp import forget, forgotten_on_error, scaler_mismatch, scaler_step, skipped
from ._compile import eager, eager_context
from ._global_stats import clip_scale, complete_grads, sharded, stats
from ._layout import _identity, local
from .functional import (Rows, StepResult, _increment_version, _number, _threads, launch,
                         torch_threads)
from ._signals import deferred_interrupts
from ._state import _count
from ._groups import (MATH_KEYS, adamw_of, apply_saved, as_torch_groups, check_group,
                      check_unique, corrected, group_math, load_post_hooks,
                      load_pre_hooks, read_saved, saved_entry, set_math)
from .optim import AdamW

_FLOAT16 = (torch.bfloat16, torch.float16)
_LOAD_HOOKS = ("_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")


@contextlib.contextmanager
def _without_load_hooks(optimizer):
    """torch's load_state_dict without its hooks, which the caller runs itself."""
    held = {name: optimizer.__dict__[name] for name in _LOAD_HOOKS if name in optimizer.__dict__}
    for name in held:
        setattr(optimizer, name, type(held[name])())
    try:
        yield
    finally:
        optimizer.__dict__.update(held)
_STATE_KEYS = ("exp_avg", "exp_avg_sq", "master_param")
_CELLS = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double,
          torch.int64: ctypes.c_int64}


def _weak(t):
    """A callable giving t back while it lives (None stays None)."""
    return (lambda: None) if t is None else weakref.ref(t)


def _kernel_ready(value, p, key, index):
    """A state tensor as the kernel reads it: fp32, contiguous, on the CPU, with the parameter's
    shape. One a user assigned otherwise (zeros_like(p) for a 16-bit parameter, a transposed
    parameter's moments) is copied so; another shape (one of as many elements, transposed,
    would step scrambled) or a non-tensor is refused before anything is written."""
    where = f"optimizer.state of parameter {index}"
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: {key} is a {type(value).__name__}, not a tensor")
    t, shard = local(value), local(p)
    if t.shape != shard.shape:
        raise ValueError(f"{where}: {key} has shape {tuple(t.shape)}, its parameter "
                         f"{tuple(shard.shape)}")
    if t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous():
        return value
    ready = value.detach().to(device="cpu", dtype=torch.float32,
                              memory_format=torch.contiguous_format, copy=True)
    return ready if local(ready) is not ready else ready.reshape(local(p).shape)  # DTensor: as is


def _count_steps(states):
    """state["step"] += 1 in each. A plain one-element CPU tensor, as torch.optim.AdamW makes
    them, is added to at its address and its version counted as torch's in-place add counts it:
    torch's add costs a microsecond a tensor (foreach too), more than the kernel on a small
    parameter. Every address is taken, and torch's adds done, before any is written. Without
    increment_version (torch < 2.1), and for any other count, torch's add as before."""
    cells, direct, others = [], [], []
    for state in states:
        count = state["step"]
        if _increment_version is not None and type(count) is torch.Tensor and \
                count.layout is torch.strided and count.is_cpu and count.dim() == 0 and \
                not (count.is_inference() or count.is_neg() or count._is_zerotensor()):
            cell = _CELLS.get(count.dtype)
            if cell is not None:
                cells.append(cell.from_address(count.data_ptr()))
                direct.append(count)
                continue
        others.append(state)
    plain = [state["step"] for state in others if type(state["step"]) is torch.Tensor]
    if plain:  # one call, not one per parameter; first, as it may raise
        torch._foreach_add_(plain, 1)
    for state in others:
        if type(state["step"]) is not torch.Tensor:  # a number, a subclass: as it counts
            state["step"] += 1
    for cell in cells:
        cell.value += 1
    if direct:
        _increment_version(direct)


def _unfit(index, shard, **tensors):
    """Why the kernel cannot step parameter `index` with these tensors."""
    for name, t in tensors.items():
        if t.numel() != shard.numel():
            return (f"parameter {index} has {shard.numel()} elements and its {name} "
                    f"{t.numel()}: a resized parameter (.data =) needs a new optimizer, or its "
                    "state and gradient resized with it")
        if not t.is_cpu or (name != "grad" and t.dtype is not torch.float32) or \
                not t.is_contiguous():
            return (f"parameter {index}: its {name} is now a {t.dtype} tensor on {t.device}"
                    f"{'' if t.is_contiguous() else ', not contiguous'}; the kernel steps fp32 "
                    "moments and master weights, and gradients, held contiguous on the CPU")
    raise AssertionError("no unfit tensor")


class InProcessAdamW(AdamW):
    """AdamW(..., worker=False). See zenflow_bind.optim.AdamW and zenflow_bind.optim(3)."""

    state = None  # torch's plain per-parameter dict (set by Optimizer.__init__), not a snapshot

    def _begin(self, cpus, threads, mems):
        if self.overlap:
            raise ValueError("overlap=True lets a worker step while the next forward pass runs: "
                             "it needs worker=True")
        if cpus is not None or mems is not None:
            raise ValueError("cpus and mems place a worker; with worker=False the step runs on "
                             "this process's own CPUs (srun --zenflow-bind=mode=offload binds "
                             "them)")
        self.threads = None if threads is None else _threads(threads, least=1)
        self._pending_scale = None  # given to step_during_backward(), for the step() after it
        self._seen = {}  # 16-bit parameter -> (data_ptr, _version) after our last write
        self._ready = {}  # parameter -> its state tensors as last made ready for the kernel

    @property
    def worker(self):
        """None: this optimizer steps in the calling process."""
        return None

    def __getstate__(self):
        """torch's (defaults, state, param_groups; no hooks) and this class's settings: copy.
        deepcopy and pickle give a working optimizer, as torch's do."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_busy", "_busy_by", "_ready", "step") and
                not k.startswith("_optimizer_")}

    def __setstate__(self, state):
        super().__setstate__(state)  # torch's: also what its load_state_dict() calls
        if "_busy" not in self.__dict__:
            self._busy, self._busy_by, self._ready = threading.Lock(), (None, None), {}

    @eager_context
    def step_during_backward(self, grad_scale=1.0):
        """Nothing to overlap in this process: backward runs as it is, and step() steps every
        parameter with grad_scale (the same bits as the worker's steps during backward), so a
        loop written for the worker runs unchanged."""
        if self._pending_scale is not None:
            raise RuntimeError("step_during_backward() twice without step() between")
        grad_scale = _number("grad_scale", grad_scale)
        if not math.isfinite(grad_scale):
            raise ValueError(f"invalid grad_scale {grad_scale}: must be finite")
        self._pending_scale = grad_scale
        ok = False
        try:
            yield self
            ok = True
        finally:
            if not ok:  # backward raised: nothing was stepped, nothing is pending
                self._pending_scale = None

    def add_param_group(self, param_group):
        math = group_math(param_group, self.defaults)
        torch.optim.Optimizer.add_param_group(self, param_group)
        set_math(self.param_groups[-1], *math)
        try:
            check_group(self.param_groups[-1])
            check_unique(self.param_groups[-1])
            for i, p in enumerate(self.param_groups[-1]["params"]):
                if p.dtype not in (torch.float32,) + _FLOAT16:
                    raise TypeError(f"zenflow_bind.optim.AdamW optimizes fp32, bf16 and fp16 "
                                    f"parameters, not {p.dtype}")
                if local(p).device.type != "cpu":
                    raise ValueError(f"with worker=False every parameter is on the CPU (FSDP2's "
                                     f"CPUOffloadPolicy, a CPU model); one is on "
                                     f"{local(p).device}")
        except BaseException:
            self.param_groups.pop()
            raise

    def _state_of(self, p):
        state = self.state[p]
        if not state:  # as torch.optim.AdamW: at the parameter's first step with a gradient
            fp32 = dict(dtype=torch.float32, memory_format=torch.contiguous_format)
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, **fp32)
            state["exp_avg_sq"] = torch.zeros_like(p, **fp32)
            if p.dtype in _FLOAT16:
                state["master_param"] = p.detach().to(torch.float32, copy=True)
        return state

    @eager
    @torch.no_grad()
    @forgotten_on_error
    def step(self, closure=None, *, grad_scale=None):
        """One AdamW step over every parameter with a gradient, in this process. grad_scale
        multiplies every gradient first (None: 1, or the one step_during_backward() was given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        given, self._pending_scale = self._pending_scale, None
        if given is not None and grad_scale is not None and _number("grad_scale",
                                                                     grad_scale) != given:
            raise ValueError(f"step(grad_scale={grad_scale}) after step_during_backward("
                             f"grad_scale={given}): give it once")
        scale = given if given is not None else 1.0 if grad_scale is None else grad_scale
        scale = _number("grad_scale", scale)
        complete_grads(self._all_params())  # (tensor parallelism's partial sums)
        amp = scaler_step(self)  # inside GradScaler.step(): its scale and inf check
        if amp is not None and amp.skip:  # nothing happens, as with torch's AdamW
            skipped(self)
            return loss
        if amp is not None and given is not None and amp.multiplier != given:
            raise ValueError(scaler_mismatch(amp, given, False))  # before any step
        if amp is not None and given is None and amp.multiplier is not None:
            scale *= amp.multiplier
        if not math.isfinite(scale):
            raise ValueError(f"invalid grad_scale {scale}: must be finite")
        # Ctrl-C waits for the end of the step: between two kernel calls, or between the kernel
        # and the write-back and step counts, it would leave the state torn
        with self._exclusive("step"), deferred_interrupts():
            self._step(scale)
        return loss

    def _step(self, grad_scale):
        buckets, stepped, write_back, fresh, sixteen, grads = {}, [], [], [], [], {}
        maximize = {bool(g["maximize"]) for g in self.param_groups}
        if len(maximize) > 1:
            raise ValueError("maximize must be the same in every param group: one step negates "
                             "every gradient at once")
        try:
            self._gather(buckets, stepped, write_back, fresh, sixteen, grads)
        except BaseException:
            for p in fresh:  # as if step() had not been called
                self.state.pop(p, None)
            raise
        skip, clip, norm = self.skip_nonfinite, self.max_grad_norm, self._want_norm
        params = self._all_params()
        together = sharded(params) and (skip or norm)  # every rank takes part, gradients or not
        if not buckets and not together:
            return
        scale = -grad_scale if maximize.pop() else grad_scale
        threads = self.threads or torch_threads()
        found = None
        if (len(buckets) > 1 or together) and (skip or norm):
            # One decision over every bucket before any is written, and over every rank's shards:
            # the pre-pass done here.
            nonfinite, sum_squares = stats(params, grads, scale, threads)
            found = StepResult(nonfinite, math.sqrt(sum_squares), skip and nonfinite > 0, 0.0)
            if clip > 0 and not found.skipped:
                scale *= clip_scale(clip, sum_squares)
            skip, clip, norm = False, 0.0, False
        results = []
        if found is None or not found.skipped:
            for (grad_dtype, copy_dtype), rows in buckets.items():
                results.append(launch(rows, grad_dtype, copy_dtype, rows.hyper, 1, scale,
                                      skip, clip, norm, threads))
        seconds = sum(r.seconds for r in results)
        if found is None:  # each bucket decided alone: there is one, or nothing global was asked
            found = StepResult(sum(r.nonfinite for r in results), results[0].grad_norm,
                               results[0].skipped, seconds)
        self.last_step_skipped = found.skipped
        self.last_nonfinite = found.nonfinite
        self.last_grad_norm = found.grad_norm if self._want_norm else None
        self.last_step_seconds = seconds
        if found.skipped:  # as if step() had not been called: no state for a first step
            for p in fresh:
                del self.state[p]
            return
        for target, original in write_back:
            original.copy_(target)
        for p in sixteen:
            self._seen[p] = _identity(p)
        _count_steps(stepped)

    def _gather(self, buckets, stepped, write_back, fresh, sixteen, grads):
        """Each parameter with a gradient into its bucket (functional.Rows, one per gradient and
        copy-out dtype), its state made ready for the kernel; what to write back after the
        kernel. One pass, few calls per parameter: with thousands of small parameters, this loop
        is most of the step."""
        index = -1
        states, ready_of = self.state, self._ready
        for group in self.param_groups:
            check_group(group)
            hyper = _native.hyper(float(group["lr"]), tuple(float(b) for b in group["betas"]),
                                  float(group["eps"]), float(group["weight_decay"]),
                                  adamw_of(group), corrected(group))
            address = ctypes.addressof(hyper)
            for p in group["params"]:
                index += 1
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("zenflow_bind.optim.AdamW does not support sparse "
                                       "gradients")
                state = states.get(p)
                if not state:
                    fresh.append(p)
                    state = self._state_of(p)
                m, v, master = state.get("exp_avg"), state.get("exp_avg_sq"), \
                    state.get("master_param")
                ready = ready_of.get(p)  # weak: a replaced tensor is not kept alive
                if ready is None or ready[0]() is not m or ready[1]() is not v or \
                        ready[2]() is not master:
                    for key in _STATE_KEYS:  # tensors not seen before: checked once
                        if key in state:
                            state[key] = _kernel_ready(state[key], p, key, index)
                    m, v, master = state["exp_avg"], state["exp_avg_sq"], \
                        state.get("master_param")
                    ready_of[p] = (_weak(m), _weak(v), _weak(master))
                shard, m, v = local(p), local(m), local(v)
                if not shard.is_cpu:  # the kernel reads host memory: a CUDA address would crash
                    raise ValueError(f"parameter {index} is on {shard.device} now: with "
                                     "worker=False every parameter is on the CPU; make the "
                                     "optimizer after moving the model")
                dtype, copy = p.dtype, None
                if dtype is not torch.float32:
                    if dtype not in _FLOAT16:
                        raise TypeError(f"parameter {index} is {dtype} now: the optimizer "
                                        "steps fp32, bf16 and fp16 parameters")
                    if master is None:
                        raise TypeError(f"parameter {index} is {dtype}, and its state has no "
                                        "master_param (its fp32 master weights): was it fp32 "
                                        "when its state was made?")
                    master = local(master)
                    self._refresh_master(p, master)
                    sixteen.append(p)
                    copy = shard if shard.is_contiguous() else shard.contiguous()
                    if copy is not shard:
                        write_back.append((copy, shard))
                else:
                    master = shard
                target = master if master.is_contiguous() else master.contiguous()
                if target is not master:
                    write_back.append((target, master))
                grad = local(grad)
                if grad._is_zerotensor() or grad.is_neg():  # (a gradient of zeros without
                    grad = grad.clone()  # memory; a lazily negated one): as values, as torch's
                if grad.dtype is not dtype:
                    grad = grad.to(dtype)
                if not grad.is_contiguous():
                    grad = grad.contiguous()
                # The kernel walks the parameter's count through every buffer: each one checked
                # at every step, since .data = re-seats a tensor in place (a resized model)
                n = shard.numel()
                if grad.numel() != n or m.numel() != n or v.numel() != n or \
                        target.numel() != n or \
                        not (grad.is_cpu and m.is_cpu and v.is_cpu and target.is_cpu) or \
                        m.dtype is not torch.float32 or v.dtype is not torch.float32 or \
                        target.dtype is not torch.float32 or \
                        not (m.is_contiguous() and v.is_contiguous()):
                    raise ValueError(_unfit(index, shard, grad=grad, exp_avg=m, exp_avg_sq=v,
                                            master_param=target))
                grads[id(p)] = grad
                key = (dtype, None) if copy is None else (dtype, dtype)
                rows = buckets.get(key)
                if rows is None:
                    rows = buckets[key] = Rows(hyper)
                rows.add(target, grad, m, v, copy, address, int(state["step"]) + 1)
                rows.alive.append(hyper)  # the row points to it
                stepped.append(state)

    def _refresh_master(self, p, master):
        """A 16-bit parameter the user wrote since our last write (load_state_dict of the model,
        copy_, a re-initialisation) becomes the master again, as in the worker, unless it holds
        exactly what the master rounds to (a model and optimizer checkpoint loaded in either
        order): then the master keeps the bits the parameter lacks."""
        if self._seen.get(p) == _identity(p):
            return
        shard = local(p).detach()
        if not torch.equal(master.to(shard.dtype), shard):
            master.copy_(shard.reshape(master.shape))
        self._seen[p] = _identity(p)

    def synchronize(self):
        """Nothing to wait for: every step completed in step()."""

    def register_ddp(self, model, hook=None, state=None):
        """Nothing to take: step() reads the gradients where DDP averaged them (.grad), so that
        a loop written for the worker runs unchanged. Only checks that model is a DDP and hook
        a callable; DDP's own reduction (or `hook`, registered as DDP's with its state) runs."""
        hook, state = _ddp.checked(model, hook, state)
        if hook is not None:
            model.register_comm_hook(state, hook)

    def state_dict(self):
        """torch's state dict of torch's optimizer.state: the worker's format."""
        with self._reading_state():
            as_torch_groups(self.param_groups)  # a math key a user set since, as it is saved
            out = torch.optim.Optimizer.state_dict(self)
            return out

    def load_state_dict(self, state_dict):
        """torch's load, with the moments and the master weights kept in fp32 (torch casts a
        state to its parameter's dtype); a 16-bit parameter without a saved master takes the
        model's values (load the model first). Every entry is checked before anything changes."""
        with self._exclusive("load_state_dict"):
            forget(self)  # a GradScaler's attributes, if a step it began raised
            state_dict = load_pre_hooks(self, state_dict)  # what they return is what loads
            params, saved, updates = self._check_saved(state_dict)
            before = [dict(g) for g in self.param_groups]
            with _without_load_hooks(self):  # run here, before the checks and after the state
                torch.optim.Optimizer.load_state_dict(self, state_dict)
            # torch replaces each group with the saved one: its settings in this optimizer's
            # keys, and what it lacks (but its math) as it was here
            for group, old, update in zip(self.param_groups, before, updates):
                apply_saved(group, update)
                for key, value in old.items():
                    if key not in MATH_KEYS:
                        group.setdefault(key, value)
            self._seen = {}  # the masters below are compared with the model at the next step
            self._ready = {}
            for p, entry in zip(params, saved):
                if not entry:
                    continue
                state = self.state[p]
                for key in ("exp_avg", "exp_avg_sq", "master_param"):
                    if key in entry:  # in the parameter's element order, as the kernel reads
                        state[key] = entry[key].detach().to(
                            device=p.device, dtype=torch.float32,
                            memory_format=torch.contiguous_format, copy=True)
                if p.dtype in _FLOAT16 and "master_param" not in entry:
                    state["master_param"] = p.detach().to(torch.float32, copy=True)
                state["step"] = torch.tensor(float(_count(entry["step"], "")))
            load_post_hooks(self)

    def _check_saved(self, state_dict):
        groups, states, updates = read_saved(self.param_groups, state_dict)
        params, saved = [], []
        for group, theirs in zip(self.param_groups, groups):
            for key, p in zip(theirs["params"], group["params"]):
                entry = saved_entry(states, key, f"parameter {key!r}")
                if entry:
                    missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if k not in entry]
                    if missing:
                        raise ValueError(f"parameter {key!r}: its state has no "
                                         f"{', '.join(missing)}")
                    for k in ("exp_avg", "exp_avg_sq", "master_param"):
                        if not isinstance(entry.get(k, torch.empty(0)), torch.Tensor):
                            raise TypeError(f"parameter {key!r}: {k} is a "
                                            f"{type(entry[k]).__name__}, not a tensor")
                        if k in entry and entry[k].shape != p.shape:
                            raise ValueError(f"parameter {key!r}: {k} has shape "
                                             f"{tuple(entry[k].shape)}, its parameter "
                                             f"{tuple(p.shape)}")
                    _count(entry["step"], f"parameter {key!r}")  # before torch's load changes
                params.append(p)
                saved.append(entry)
        return params, saved, updates

    def close(self):
        """Nothing to release: there is no worker."""
