"""zenflow_bind.optim.AdamW: torch.optim.AdamW with its step in a zenflow-optimizer worker.

    import torch, zenflow_bind.optim
    model = torch.nn.Transformer(d_model=256, nhead=4)
    opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss = model(src, tgt).sum(); loss.backward()
    opt.step(); opt.zero_grad()

Each param_group is one worker group; the Adam moments and the fp32 master weights live in the
worker (see _layout.py for what is shared and what is copied), so this process keeps no optimizer
state between steps: optimizer.state is brought out of the worker when it is read (_state.py).
Semantics, arguments and the state dict are torch's; see zenflow_bind.optim(3)."""

import atexit
import contextlib
import functools
import math
import os
import sys
import threading
import time
import warnings
import weakref

import torch

from ._amp import (SUPPORTED as _AMP_SCALING, forget, forgotten_on_error, scaler_mismatch,
                   scaler_step, skipped)
from . import _ddp
from ._compile import eager, eager_context
from ._cuda import Gpu
from ._global_stats import clip_scale, complete_grads, sharded, stats
from ._groups import (adamw_of, apply_saved, as_torch_groups, check_group, check_unique,
                      corrected, group_math, load_post_hooks, load_pre_hooks,
                      only_torch_flags, read_saved, saved_entry, set_math)
from ._layout import Layout, local, shared_grad
from .functional import _number, torch_threads
from ._native import MAX_GROUPS, STEP_GRAD_NORM, STEP_SKIP_NONFINITE, ZenbindError
from ._signals import deferred_interrupts
from ._state import Snapshot, cast_like, extras, prepare_group_state, saved_step
from ._stream import Stream
from .worker import StepResult, Worker

__all__ = ["AdamW"]

def _hyper(group):
    return dict(lr=float(group["lr"]), betas=tuple(float(b) for b in group["betas"]),
                eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                adamw=adamw_of(group), bias_correction=corrected(group))


def _offload_plan():
    """Whether the plugin planned this task for mode=offload: every CPU to training, none (and
    no ZENFLOW_OPT_CPUS) for a worker."""
    options = os.environ.get("ZENFLOW_BIND_OPTIONS", "").split(",")
    return "mode=offload" in options and "ZENFLOW_OPT_CPUS" not in os.environ


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW whose step runs in a pinned zenflow-optimizer worker.

    torch's arguments (amsgrad, capturable and differentiable only False; foreach and fused
    accepted and irrelevant: the worker always runs one fused, threaded pass), DeepSpeedCPUAdam's
    adamw_mode (False: Adam with L2) and bias_correction, and:
      overlap          step() submits and returns; the update lands in the model at the next
                       step() or synchronize() (gradients are computed one step stale); fixed
                       at construction (only then does the worker keep two gradient buffers)
      skip_nonfinite   a step whose scaled gradients hold an inf or NaN writes nothing
                       (GradScaler's rule); see last_step_skipped
      max_grad_norm    > 0: clip by the global L2 norm, like clip_grad_norm_, in the worker
      grad_norm        compute the global norm even without clipping (last_grad_norm)
      cpus, threads, mems   the worker's; None takes ZENFLOW_OPT_* (the plugin's plan)
      timeout_ms       bound on waiting for one step
      bucket_elements  parameters are stepped in buckets of about this many elements (at most
                       16 per param group), each as soon as its gradients have landed inside
                       step_during_backward()
      worker           False: step in this process instead, on its own threads (threads, else
                       torch.get_num_threads()); the same kernel and the same state format, so
                       a checkpoint moves between the two (srun --zenflow-bind=mode=offload,
                       FSDP2's CPUOffloadPolicy)
    """

    # GradScaler.step() hands its scale and inf check to step() (_amp.py) rather than unscaling
    _step_supports_amp_scaling = _AMP_SCALING

    def __new__(cls, *args, worker=True, **kwargs):
        if not worker:
            from ._in_process import InProcessAdamW
            if cls is AdamW:
                cls = InProcessAdamW
            elif not issubclass(cls, InProcessAdamW):
                raise TypeError(f"worker=False makes a zenflow_bind.optim.AdamW that steps in "
                                f"this process, a class of its own; {cls.__name__}, a subclass "
                                f"of the worker's, cannot be one")
        return super().__new__(cls)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, adamw_mode=True, bias_correction=True,
                 overlap=False, skip_nonfinite=False, max_grad_norm=0.0, grad_norm=False,
                 cpus=None, threads=None, mems=None, timeout_ms=600_000, worker=True,
                 bucket_elements=1 << 24):
        defaults = set_math(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                                 capturable=capturable, differentiable=differentiable,
                                 fused=fused), adamw_mode, bias_correction)
        check_group(defaults)
        only_torch_flags(defaults)
        max_grad_norm = _number("max_grad_norm", max_grad_norm)
        if not (max_grad_norm >= 0.0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"invalid max_grad_norm {max_grad_norm}: must be >= 0 (0: no clip)")
        self._overlap = bool(overlap)
        self.skip_nonfinite = bool(skip_nonfinite)
        self.max_grad_norm = max_grad_norm
        self._want_norm = bool(grad_norm) or self.max_grad_norm > 0
        timeout = _number("timeout_ms", timeout_ms)
        if not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"invalid timeout_ms {timeout_ms}: must be a count of milliseconds "
                             ">= 0 (0: do not wait)")
        self.timeout_ms = int(timeout)
        self.bucket_elements = int(bucket_elements)
        if self.bucket_elements < 1:
            raise ValueError(f"invalid bucket_elements {bucket_elements}: must be >= 1")
        self._busy = threading.Lock()  # one step() or state call at a time (_exclusive)
        self._busy_by = (None, None)  # (thread id, call) holding it
        self.last_step_skipped = False
        self.last_grad_norm = None
        self.last_nonfinite = 0
        self.last_step_seconds = 0.0
        self._begin(cpus, threads, mems)
        try:
            super().__init__(params, defaults)
        except BaseException:
            self.close()
            raise

    def _begin(self, cpus, threads, mems):
        """What this class steps with: a worker on cpus/threads/mems."""
        self._layouts = []      # one per param_group (None for one without local elements)
        self._held = []         # per param_group: its params list as the layout took it, and
        # their ids (torch's Optimizer follows param_groups edited in place; the worker cannot)
        self._steps = {}        # param -> steps it took with a gradient: torch's state["step"]; a
        # parameter with a state is here, at 0 too (a reset), one without none
        self._extra = {}        # param -> the keys of its state entry that are not AdamW's
        self._snapshot = None   # optimizer.state as last brought out of the worker
        self._in_flight = None  # what to do once the submitted step is done
        self._decided = None    # (non-finite, norm) counted over every rank for it (FSDP2)
        self._empty = []        # its parameters with no element here, counted once it completes
        self._buffer = 0        # the gradient buffer backward fills next
        self._stream = None     # step_during_backward()'s buckets, until step() completes them
        self._stream_open = False  # inside step_during_backward(): hooks submit buckets
        self._stream_scale = None  # the grad_scale step_during_backward() was given
        self._torn = False      # some buckets took a step that cannot be completed
        self._ddp_reduced = {}  # id -> weakref of each parameter DDP reduces (register_ddp())
        self._ddp_slots = {}    # id(parameter) -> its slot, for those of them optimized here
        self._ddp_model = None  # weakref to the DDP model they come from (register_ddp())
        self._ddp_lock = threading.Lock()  # a reduced bucket's copy against close() unmapping
        if cpus is None and _offload_plan():
            warnings.warn("srun --zenflow-bind=mode=offload gave this task no optimizer CPUs: "
                          "the worker shares the training CPUs; step in this process with "
                          "AdamW(..., worker=False), or give the worker cpus=", stacklevel=3)
        self._worker = Worker(cpus=cpus, threads=threads, mems=mems)
        self._gpu = Gpu()  # pinned buffers and copy streams, once a CUDA parameter comes
        # Dropped without close(), the optimizer still gives the model its gradients' private
        # memory again and stops its worker: the finaliser holds what that needs, never the
        # optimizer itself.
        self._finalizer = weakref.finalize(self, _release, self._layouts, self._worker,
                                           self._gpu)
        if not _EXITING_HOOKED:  # after weakref's own exit hook: runs before the finalisers
            _EXITING_HOOKED.append(atexit.register(_EXITING.append, True))

    def __getstate__(self):
        raise TypeError("a zenflow_bind.optim.AdamW cannot be pickled or copied: its master "
                        "weights and moments live in its worker process. Save its state_dict() "
                        "(torch.save, DCP) and load it into a new optimizer")

    @property
    def overlap(self):
        """Whether step() returns before the update lands (fixed at construction: without it
        the worker keeps one gradient buffer, not two)."""
        return self._overlap

    @overlap.setter
    def overlap(self, value):
        if bool(value) != self._overlap:
            raise AttributeError("overlap is fixed when the optimizer is made (the worker keeps "
                                 "a second gradient buffer for it only): make a new optimizer "
                                 "and load_state_dict() this one's state")

    # -- optimizer.state ----------------------------------------------------------------------

    @property
    def state(self):
        """torch's per-parameter state ("step", "exp_avg", "exp_avg_sq", and "master_param" for a
        16-bit parameter; DTensors for DTensor parameters), brought out of the worker when read
        after a step. Writes to it (in place or by assignment) reach the worker at the next
        step() or state_dict()."""
        if self._snapshot is None:
            # state_dict() reads it as its own part, and so may load_state_dict()'s hooks (not a
            # signal handler in the middle of the load)
            inside = self._inside("state_dict") or self._in_load_hooks_here()
            with contextlib.nullcontext() if inside else self._exclusive("optimizer.state"):
                self._live()
                self._not_mid_step("read optimizer.state", reads_state=True)
                self._finish()
                self._snapshot = Snapshot(self._layouts, self._steps, self.param_groups,
                                          self._extra)
        return self._snapshot.state

    @state.setter
    def state(self, value):
        # torch.optim.Optimizer.__init__ assigns an empty defaultdict before any param group;
        # anything else (an empty dict too: torch's way to reset) would be a load
        if value or "param_groups" in self.__dict__:
            raise TypeError("assign optimizer.state through load_state_dict(), which checks it "
                            "and hands it to the worker")

    def _push_state_edits(self, keep=False):
        """What a user or a library wrote into optimizer.state since it was read goes to the
        worker; the snapshot is dropped (the next read brings the state out again), unless keep
        and nothing was written: then it still holds what the worker holds, and a state_dict()
        after another (a checkpoint, then a log of it) need not bring it out again. A write the
        worker cannot take (a wrong shape, say) raises here and stays in the snapshot, so it
        raises again until it is mended: no edit is dropped unseen."""
        snapshot = self._snapshot
        if snapshot is None:
            return
        states = snapshot.state
        elsewhere = self._counts_elsewhere(states)
        edited = snapshot.edited_groups()
        for i in edited:
            layout = self._layouts[i]
            prepared = prepare_group_state(layout, [states.get(s.param) for s in layout.slots],
                                           f"optimizer.state of param group {i}")
            self._apply_group_state(layout, prepared)
        for p, count in elsewhere:
            self._set_count(p, count)
        self._keep_extras(snapshot.held())  # (written or not: a library's keys are its own)
        if edited or not keep:
            self._snapshot = None

    def _set_count(self, p, count):
        """p's step count from now on: None for no state; 0 is a state (torch's after a
        reset)."""
        if count is None:
            self._steps.pop(p, None)
        else:
            self._steps[p] = count

    def _counts_elsewhere(self, states):
        """(parameter, its step count or None) for the parameters of groups with no element
        here, as optimizer.state holds them now: a count written there (or an entry deleted) is
        the count the next step goes on from, as in the groups the worker holds."""
        counts = []
        for i, (group, layout) in enumerate(zip(self.param_groups, self._layouts)):
            if layout is None:
                counts += [(p, saved_step(states.get(p), f"optimizer.state of param group {i}, "
                                                         f"parameter {k}"))
                           for k, p in enumerate(group["params"])]
        return counts

    def _keep_extras(self, entries, cast=False):
        """Each (parameter, state entry): the keys that are not AdamW's, kept here (loaded ones
        cast as torch's load casts them)."""
        for p, entry in entries:
            kept = extras(entry)
            if cast:
                kept = {k: cast_like(p, v) for k, v in kept.items()}
            if kept:
                self._extra[p] = kept
            else:
                self._extra.pop(p, None)

    # -- groups -----------------------------------------------------------------------------

    def add_param_group(self, param_group):
        with self._exclusive("add_param_group"):
            self._add_param_group(param_group)

    def _add_param_group(self, param_group):
        self._live()
        self._not_mid_step("add a param group")
        self._finish()  # the worker takes no new group while a step is in flight
        self._push_state_edits()
        math = group_math(param_group, self.defaults)
        super().add_param_group(param_group)
        group = set_math(self.param_groups[-1], *math)
        first = sum(len(g["params"]) for g in self.param_groups[:-1])
        layout = None
        try:
            check_group(group)
            check_unique(group)
            for i, p in enumerate(group["params"]):
                owner = _OWNERS.get(id(p), lambda: None)()
                if owner is not None and owner is not self and not owner._worker.closed:
                    if not owner._worker.dead():
                        raise ValueError(f"parameter {first + i} is already optimized by "
                                         "another zenflow_bind.optim.AdamW, whose worker holds "
                                         "its master weights: close() that one first")
                    try:  # its worker died: this one is the recovery (_AFTER_DEATH)
                        owner.close()
                    except ZenbindError:  # (its step in flight died with it: closed all the same)
                        pass
            has_elements = any(local(p).numel() for p in group["params"])
            if has_elements and len(self._worker.groups) >= MAX_GROUPS:
                raise ValueError(f"param group {len(self.param_groups) - 1} does not fit: the "
                                 f"worker's {MAX_GROUPS} groups are taken (a param group takes "
                                 "one or more, its buckets); merge param groups whose "
                                 "hyperparameters are equal, or use worker=False, which has no "
                                 "such limit")
            # Views made under inference_mode would turn the model's parameters into inference
            # tensors, which autograd then refuses.
            with torch.inference_mode(False):
                layout = Layout(self._worker, group["params"], _hyper(group),
                                first_index=first, bucket_elements=self.bucket_elements,
                                grad_buffers=2 if self.overlap else 1) \
                    if has_elements else None
            if layout is not None:
                self._gpu.adopt(layout)  # pinned (CUDA parameters), or a refusal
            me = weakref.ref(self)
            for slot in layout.slots if layout else ():
                slot.watch(functools.partial(_filling, me), functools.partial(_landed, me),
                           self._gpu)
        except BaseException:
            # as if never added: param_groups and layouts stay paired, one to one, and the
            # worker holds what it held before (the layout's groups and their memory go)
            try:
                if layout is not None:
                    with deferred_interrupts():
                        try:
                            self._gpu.forget(layout)
                        finally:
                            layout.remove()
            finally:
                self.param_groups.pop()
            raise
        self._layouts.append(layout)
        self._held.append((group["params"], tuple(map(id, group["params"]))))
        for slot in layout.slots if layout and self._takes_ddp() else ():
            _ddp.adopt(self, slot)
        for p in group["params"]:
            _OWNERS[id(p)] = me  # the optimizer holds p: its id is not reused meanwhile

    # -- steps ------------------------------------------------------------------------------

    @eager
    @torch.no_grad()
    @forgotten_on_error
    def step(self, closure=None, *, grad_scale=None):
        """One AdamW step over every parameter with a gradient (torch's rule: a parameter whose
        .grad is None is left alone). grad_scale multiplies every gradient first (1/loss_scale to
        unscale; after step_during_backward(), the one given there). In overlap mode the update
        lands at the next step() or synchronize()."""
        if grad_scale is not None:
            grad_scale = _number("grad_scale", grad_scale)
            if not math.isfinite(grad_scale):
                raise ValueError(f"invalid grad_scale {grad_scale}: must be finite")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._exclusive("step"):
            self._live()
            if self._stream_open:
                raise RuntimeError("step() inside step_during_backward(): leave the with block "
                                   "(backward done) first")
            if self._torn:
                raise RuntimeError(_TORN)
            stream, self._stream = self._stream, None
            given, self._stream_scale = self._stream_scale, None
            if stream is not None and stream.error is not None:
                self._fail_stream(stream)
            twice = None
            complete_grads(self._all_params())  # (tensor parallelism's partial sums)
            amp = scaler_step(self)  # inside GradScaler.step(): its scale and inf check
            if amp is not None and amp.skip:
                return self._skip_for_scaler(stream, loss)
            if given is not None:
                went = stream is not None and bool(stream.stepped)
                if grad_scale is not None and grad_scale != given:
                    twice = ValueError(f"step(grad_scale={grad_scale}) after step_during_"
                                       f"backward(grad_scale={given}): give it once " +
                                       (f"(the step was taken with {given})" if went else
                                        "(no step was taken)"))
                elif amp is not None and amp.multiplier != given:
                    twice = ValueError(scaler_mismatch(amp, given, went))
                if twice is not None and not went:
                    raise twice  # nothing stepped yet: refused before anything is
                grad_scale = given  # else raised once the step is whole
            elif amp is not None and amp.multiplier is not None:
                grad_scale = (1.0 if grad_scale is None else grad_scale) * amp.multiplier
            grad_scale = 1.0 if grad_scale is None else grad_scale
            # unscale_() divided the gradients in place: the hooks' copies were made before
            again = amp is not None and amp.multiplier is None
            if stream is not None and stream.stepped:
                self._complete_stream(stream)
                if twice is not None:
                    raise twice
                return loss
            self._finish()
            self._follow_moves()
            self._push_state_edits()
            self._gpu.grads_landed()  # a hook's copy in flight lands before any copy of ours
            k = self._buffer
            pending, any_grad = [], False
            for layout in self._layouts:
                if layout is None:
                    continue
                has = []
                for slot in layout.slots:
                    slot.refresh_if_changed()
                    has.append(slot.stage_grad(k, again))
                any_grad |= any(has)
                pending.append((layout, has))
            params = self._all_params()
            together = sharded(params) and (self.skip_nonfinite or self._want_norm)
            empty = self._empty_with_grads()
            if not any_grad and not together:
                self._count_steps(empty)
                return loss  # as torch: nothing else to do
            scale = self._set_hypers(grad_scale)
            flags = (STEP_SKIP_NONFINITE if self.skip_nonfinite else 0) | \
                (STEP_GRAD_NORM if self._want_norm else 0)
            max_norm, decided = self.max_grad_norm, None
            if together:  # FSDP2: decided here over every rank's shards, not by each worker
                staged = {id(s.param): s.grads[k] for layout, has in pending
                          for s, h in zip(layout.slots, has) if h}
                nonfinite, sum_squares = stats(params, staged, scale, torch_threads())
                decided = (nonfinite, math.sqrt(sum_squares))
                skipped = bool(self.skip_nonfinite and nonfinite)
                if not any_grad or skipped:
                    self.last_step_skipped = skipped
                    self.last_nonfinite = nonfinite
                    self.last_grad_norm = decided[1] if self._want_norm else None
                    self.last_step_seconds = 0.0
                    if not skipped:
                        self._count_steps(empty)
                    return loss  # nothing stepped here (or anywhere, if skipped)
                if max_norm > 0:
                    scale *= clip_scale(max_norm, sum_squares)
                flags, max_norm = 0, 0.0
            # With overlap, _finish() above applied the step before, whose copies to the GPU
            # still read the masters and copy-outs that this step rewrites: done first (they
            # ran while the gradients were staged).
            self._gpu.settle()
            # submitted and recorded as in flight, or neither; with overlap, backward fills the
            # other buffer from then on (a Ctrl-C before the switch would let it write the one
            # the worker reads)
            with deferred_interrupts():
                try:
                    self._leave_idle(pending)
                    self._worker.submit(0, grad_buffer=k, grad_scale=scale, flags=flags,
                                        max_grad_norm=max_norm)
                except ZenbindError as e:
                    raise _not_applied(e) from e
                self._in_flight, self._decided, self._empty = pending, decided, empty
                if self.overlap:
                    self._switch_buffer(k)
            if not self.overlap:
                self._finish()
            if twice is not None:
                raise twice
        return loss

    def _skip_for_scaler(self, stream, loss):
        """GradScaler found an inf or NaN gradient: nothing of this step happens, as with
        torch's AdamW, unless buckets were stepped with them during backward."""
        if stream is not None and stream.stepped:
            self._torn = True
            self._restore_early()
            raise RuntimeError("GradScaler found an inf or NaN gradient after step_during_"
                               "backward() had stepped buckets with it: the worker holds a step "
                               "the model never saw; load_state_dict() a checkpoint. With a "
                               "GradScaler, give the optimizer skip_nonfinite=True (buckets then "
                               "wait for step(), which skips), or train in bfloat16 without one")
        self._finish()
        self._gpu.grads_landed()  # the hooks' copies end before backward reuses the buffer
        skipped(self)
        return loss

    def _set_hypers(self, grad_scale):
        """Every group's hyperparameters to the worker, checked; the scale with maximize's
        sign."""
        maximize = {bool(g["maximize"]) for g, l in zip(self.param_groups, self._layouts) if l}
        if len(maximize) > 1:
            raise ValueError("maximize must be the same in every param group: the worker "
                             "negates every gradient of a step at once")
        for group, layout in zip(self.param_groups, self._layouts):
            if layout is not None:
                check_group(group)
                layout.group.set_hyper(**_hyper(group))
        return -grad_scale if maximize and maximize.pop() else grad_scale

    @eager_context
    def step_during_backward(self, grad_scale=1.0):
        """Around the last backward before step(): each bucket (bucket_elements) is stepped as
        soon as its gradients have landed, while backward goes on, on the worker's cores;
        step() then steps what is left (buckets with a frozen parameter or one without a
        gradient, GPU parameters) and brings the whole update into the model. The result is
        step()'s to the bit. The gradients are final when backward produces them: grad_scale
        is given here, and changing a gradient before step() (clip_grad_norm_, unscale_) is an
        error that step() raises once it has completed the step without the change (use
        max_grad_norm and grad_scale instead). With skip_nonfinite or max_grad_norm (a decision
        over every gradient) and in overlap mode the gradients are only copied during backward
        and step() steps them all. The hyperparameters are read when the block begins. Backward
        must produce each gradient once in the block: a second backward, or a weight shared
        by two reentrant checkpointed segments, is an error step() raises. If backward raises
        in the block after some buckets have stepped, step() refuses until load_state_dict().
        CPU and CUDA parameters, torch >= 2.1."""
        self._live()
        if self._torn:
            raise RuntimeError(_TORN)
        if self._stream_open or self._stream is not None or self._stream_scale is not None:
            raise RuntimeError("step_during_backward() twice without step() between")
        grad_scale = _number("grad_scale", grad_scale)
        if not math.isfinite(grad_scale):
            raise ValueError(f"invalid grad_scale {grad_scale}: must be finite")
        with self._exclusive("step_during_backward"):
            self._follow_moves()  # before backward: its hooks copy for where the model is now
            if not self.overlap:
                # (overlap: the step in flight reads the other buffer and stays there until
                # step(); applied here, between forward and backward, it would rewrite weights
                # that backward reads)
                self._finish()
                self._gpu.settle()  # its copies to the GPU are done: the buckets may write
                self._push_state_edits()
                for layout in self._layouts:
                    for slot in layout.slots if layout else ():
                        slot.refresh_if_changed()  # before any bucket takes its master
            stream = None
            params = self._all_params()
            if not (self.overlap or self.skip_nonfinite or self.max_grad_norm > 0 or
                    (self._want_norm and sharded(params))):
                scale = self._set_hypers(grad_scale)
                stream = Stream(self._worker, self._layouts, self._buffer, scale,
                                STEP_GRAD_NORM if self._want_norm else 0, self.timeout_ms,
                                self._gpu)
            self._stream, self._stream_scale = stream, grad_scale
        self._stream_open = True
        failed = True
        try:
            yield self
            failed = False
        finally:
            self._stream_open = False
            if stream is not None:  # the buckets step with backward's gradients, all of them
                with deferred_interrupts():
                    try:
                        stream.close()
                    except BaseException:  # noqa: B036 (kept in stream.error: step() raises it)
                        pass
            if failed:  # backward raised: nothing to complete, or a step begun
                if stream is not None and stream.started():
                    self._torn = True
                    self._restore_early()
                else:
                    self._stream = self._stream_scale = None

    def _complete_stream(self, stream):
        """step() after buckets were stepped during backward: step the others, then bring the
        update into the model, or nothing of it if the worker failed."""
        k = stream.k
        applied = False
        try:
            self._gpu.grads_landed()  # a hook's copy in flight lands before any copy of ours
            changed, pending, rest = list(stream.again), [], []
            for layout in self._layouts:
                if layout is None:
                    continue
                has = []
                for slot in layout.slots:
                    if slot.group.index in stream.stepped:
                        if slot.moved():
                            # moved since the block (Module.to() moves .grad with it, values
                            # kept): the update goes into the storage it has now, whatever an
                            # early copy wrote into the one it left
                            slot.early = None
                        elif not slot.unchanged_since_staged(k) and slot.index not in changed:
                            changed.append(slot.index)
                        slot.staged = None
                        has.append(True)
                    else:
                        has.append(slot.stage_grad(k))
                pending.append((layout, has))
                rest += [b[0].group.index for b in layout.buckets
                         if b[0].group.index not in stream.stepped]
            nonfinite, seconds = stream.nonfinite, stream.seconds
            sum_squares = stream.sum_squares
            with deferred_interrupts():  # Ctrl-C waits until the step is applied, or not
                try:
                    self._leave_idle(pending)
                    for first, end in _runs(rest):
                        self._worker.submit(0, grad_buffer=k, grad_scale=stream.grad_scale,
                                            flags=stream.flags, groups=range(first, end))
                        try:
                            result = self._worker.wait_result(int(self.timeout_ms))
                        except ZenbindError as e:
                            if e.status == "ETIMEDOUT":  # in flight: collected, not applied
                                self._in_flight, self._torn = [], True
                            raise
                        nonfinite += result.nonfinite
                        seconds += result.seconds
                        sum_squares += result.grad_norm ** 2
                except ZenbindError as e:
                    raise _not_applied(e) from e
                self._empty = self._empty_with_grads()
                self._apply(pending, StepResult(nonfinite, math.sqrt(sum_squares), False,
                                                seconds))
                applied = True
        except BaseException as e:
            if not applied:  # the model keeps its parameters; the worker has some buckets'
                self._restore_early()  # step: a state dict must be loaded (unless it died)
                if stream.stepped and not isinstance(e, ZenbindError):
                    self._torn = True
            raise
        self._follow_moves()  # a model moved since the block, once its step is whole
        if changed:
            raise RuntimeError(f"the gradients of parameters {changed[:8]} changed after their "
                               "buckets had been stepped during backward (an edit after "
                               "backward, DistributedDataParallel's averaging, a second backward "
                               "in the block, or a weight used by two reentrant checkpointed "
                               "segments): the step was applied with the gradients as they were "
                               "then. Clip with max_grad_norm= and unscale with "
                               "step_during_backward(grad_scale=) instead, or step without "
                               "step_during_backward(); under DistributedDataParallel call "
                               "register_ddp(ddp_model) once, so that buckets are stepped with "
                               "DDP's averages")

    def _fail_stream(self, stream):
        """step() after a bucket failed during backward: raise, and leave the optimizer to wait
        for what is still in flight (a bucket past its timeout) and refuse to step until a
        state dict is loaded (the buckets before it took the step)."""
        e = stream.error
        self._restore_early()
        if stream.stranded:
            self._in_flight = []  # _finish() collects it later; nothing to apply
        if stream.stepped:
            self._torn = True
        if isinstance(e, ZenbindError):
            raise _not_applied(e) from e
        raise RuntimeError(f"a bucket's step failed during backward ({e!r}); nothing of this "
                           "step was applied to the model") from e

    def _follow_moves(self):
        """Follow parameters moved to another device since their group was added: model.cuda()
        after the optimizer was made keeps the Parameter objects, as torch's optimizers expect
        (Layout.follow_moves)."""
        for layout in self._layouts:
            if layout is not None:
                layout.follow_moves(self._gpu)

    def _not_mid_step(self, what, torn_ok=False, reads_state=False):
        """Refuse `what` between step_during_backward() and step(), and after a failed block
        unless torn_ok (load_state_dict(), which rewrites everything the block left). A read of
        the state (reads_state) is refused from the block's start: buckets may step at any
        moment of its backward, and a snapshot taken before them would outlive them."""
        if self._torn and not torn_ok:
            raise RuntimeError(_TORN)
        if reads_state and self._stream_open and self.overlap and self._in_flight is not None:
            # (no buckets in overlap mode) reading the state brings the step in flight into
            # the model first, which backward must not see
            raise RuntimeError(f"cannot {what} inside step_during_backward() while the step "
                               "before is in flight (overlap=True): reading it lands that step "
                               "in the weights backward is using; read it before the forward "
                               "pass or after step()")
        if self._stream is None or self._torn:
            return
        if self._stream.started():
            raise RuntimeError(f"cannot {what} between step_during_backward() and step(): "
                               "some buckets have taken this step, the others not yet")
        if reads_state:
            raise RuntimeError(f"cannot {what} between step_during_backward() and step(): "
                               "buckets may take this step during backward; read it before "
                               "the block or after step()")

    def register_ddp(self, model, hook=None, state=None):
        """Take the gradients of model, a DistributedDataParallel, as DDP reduces them: its
        communication hook becomes `hook` (DDP's averaging over its process group by default;
        a hook of torch.distributed.algorithms.ddp_comm_hooks with its state, say) followed by
        the copy of each reduced bucket into the worker's buffer, while backward goes on. Each
        gradient then leaves the GPU once, not twice, and step_during_backward() steps DDP's
        averages. Call it once (DDP takes one hook per model), or again once the DDP model it was
        given is gone (a new DDP around the same module). See zenflow_bind.optim(3), section
        DISTRIBUTED DATA PARALLEL."""
        with self._exclusive("register_ddp"):
            self._live()
            if self._takes_ddp():
                raise RuntimeError("register_ddp() was called already: DDP takes one "
                                   "communication hook per model, and this optimizer one model "
                                   "(until that DDP model is gone)")
            _ddp.register(self, model, hook, state)

    def _takes_ddp(self):
        """Whether a DDP model still alive gives its gradients (register_ddp())."""
        return self._ddp_model is not None and self._ddp_model() is not None

    def _take_reduced(self, params, once):
        """A bucket DDP reduced (_ddp.py), from the thread that completed the reduction."""
        with self._ddp_lock:  # (a reduction that outlived a failed backward, say)
            if not self._worker.closed:
                me = weakref.ref(self)
                _ddp.take(self, self._buffer, params, once, functools.partial(_landed, me))

    def synchronize(self):
        """Wait for the step in flight (overlap mode) and bring its update into the model."""
        with self._exclusive("synchronize"):
            self._live()
            self._finish()

    @contextlib.contextmanager
    def _exclusive(self, what):
        """Every call that waits for the worker or changes what it holds (step(), state_dict(),
        load_state_dict(), reading optimizer.state, synchronize(), add_param_group(), close())
        one at a time: a second one is refused before it changes anything (torch's optimizers
        are not thread-safe either, but would apply both updates; here one would be lost). The
        second may come from another thread, or from this one: a signal handler that saves a
        checkpoint, run in the middle of a step."""
        if not self._busy.acquire(blocking=False):
            # read once: the other thread may be just taking the lock or leaving (None then)
            holder, doing = self._busy_by
            who = "this thread (a signal handler or a hook?)" if \
                holder == threading.get_ident() else "another thread"
            doing = f"{doing}()" if doing else "a call"
            raise RuntimeError(f"zenflow_bind.optim.AdamW.{what}() was called while {who} is "
                               f"in {doing} of the same optimizer")
        self._busy_by = (threading.get_ident(), what)
        try:
            yield
        finally:
            self._busy_by = (None, None)
            self._busy.release()

    def _reading_state(self):
        """_exclusive("state_dict"), except in load_state_dict()'s hooks on its thread, which may
        read the state as torch's allow (a pre-hook filling what a partial checkpoint lacks
        from the current state): the load has changed nothing before them, and all after. (A
        signal handler's call in the middle of the load is refused, as any second call.)"""
        if self._in_load_hooks_here():
            return contextlib.nullcontext()
        return self._exclusive("state_dict")

    def _in_load_hooks_here(self):
        """Whether this thread runs load_state_dict()'s hooks (_groups.load_pre_hooks)."""
        return self._inside("load_state_dict") and getattr(self, "_in_load_hooks", False)

    def _inside(self, *calls):
        """Whether this thread is in one of these calls of this optimizer (under _exclusive)."""
        return self._busy_by[0] == threading.get_ident() and self._busy_by[1] in calls

    @staticmethod
    def _leave_idle(pending):
        """The parameters without a gradient are left alone by the step about to be submitted:
        no decay, no moment update (torch's rule), told to the worker as idle ranges (and none
        idle that has a gradient now)."""
        for layout, has in pending:
            layout.set_ranges(idle=None if all(has) else [not h for h in has])

    def _finish(self):
        """Wait for the step in flight and bring it into the model. The wait goes in slices so
        that Ctrl-C is seen within a slice; an interrupted wait leaves the step in flight (the
        next call finishes it), and a finished one is always recorded whole. The copies to the
        GPU of the steps before are done when it returns; those of the step it applies are
        queued: settle() before the worker or this process writes the shared buffers again."""
        self._gpu.settle()
        if self._in_flight is None:
            return
        mark = _now_ms()
        deadline = mark + self.timeout_ms
        while True:
            ask = min(_SLICE_MS, max(deadline - mark, 0))
            with deferred_interrupts():
                if self._finish_within(ask, last=mark >= deadline - _SLICE_MS):
                    return
            # a slice that took longer than asked was stopped (Ctrl-Z, Slurm suspending the
            # job, the worker with it): as in libzenbind's waits, that time does not count
            now = _now_ms()
            deadline += max(now - mark - ask, 0.0)
            mark = now

    def _finish_within(self, timeout_ms, last):
        try:
            result = self._worker.wait_result(int(timeout_ms))
        except ZenbindError as e:
            if e.status == "ETIMEDOUT" and not last:
                return False  # another slice
            if e.status == "ETIMEDOUT":  # still in flight: synchronize() again
                raise
            self._in_flight = None  # the step died with the worker, before any write_back
            raise ZenbindError(e.code, f"{_detail(e)}; {_AFTER_DEATH}") from e
        pending, self._in_flight = self._in_flight, None
        self._apply(pending, result)
        return True

    def _apply(self, pending, result):
        """A completed step's result: recorded, and its update brought into the model."""
        self.last_step_skipped = result.skipped
        self.last_nonfinite = result.nonfinite
        self.last_grad_norm = result.grad_norm if self._want_norm else None
        self.last_step_seconds = result.seconds
        if self._decided is not None:  # counted over every rank before the step was sent
            self.last_nonfinite, norm = self._decided
            self.last_grad_norm = norm if self._want_norm else None
            self._decided = None
        empty, self._empty = self._empty, []
        if not result.skipped:
            self._count_steps(empty)
        if result.skipped:
            return  # the worker wrote nothing
        for layout, has in pending:
            layout.stepped(has)
            for slot, h in zip(layout.slots, has):
                if h:
                    self._steps[slot.param] = self._steps.get(slot.param, 0) + 1
                    slot.write_back(self._gpu)
        self._gpu.publish()

    def _all_params(self):
        """Every parameter of every group, in the same order on every rank."""
        return [p for g in self.param_groups for p in g["params"]]

    def _empty_with_grads(self):
        """Parameters with a gradient in groups with no element here (FSDP2 shards left empty):
        they step as torch's, counted, with nothing to compute."""
        return [p for g, layout in zip(self.param_groups, self._layouts) if layout is None
                for p in g["params"] if p.grad is not None]

    def _count_steps(self, params):
        """One more step for each of these parameters, which have no element here."""
        for p in params:
            self._steps[p] = self._steps.get(p, 0) + 1

    def _restore_early(self):
        """A streamed step that cannot complete: the buckets that went back to the GPU get their
        old values again (their master weights keep the step: refresh_if_changed() takes the
        model's values, or load_state_dict() rewrites them)."""
        slots = [s for layout in self._layouts for s in (layout.slots if layout else ())
                 if s.early is not None]
        for k in {s.early for s in slots}:
            self._gpu.restore([s for s in slots if s.early == k], k)
        for s in slots:
            s.early = s.staged = None  # its gradient slot held the old values, not a gradient

    def _switch_buffer(self, k):
        """Overlap: backward now fills the other buffer. The gradients keep their values (torch
        leaves .grad alone in step), at the price of one copy of the gradient buffer."""
        for layout in self._layouts:
            if layout is None:
                continue
            layout.switch_grads(k)
            for slot in layout.slots:
                g = slot.param.grad
                if g is not None and not g.is_sparse and g.data_ptr() == slot.grads[k].data_ptr():
                    slot.param.grad = shared_grad(slot.grads[1 - k])
        self._buffer = 1 - k

    # -- state dict -------------------------------------------------------------------------

    def state_dict(self):
        """torch's format and hooks: state[i] = {"step": tensor, "exp_avg", "exp_avg_sq"} (fp32)
        for each parameter that took a step, plus "master_param" (its fp32 master) for a
        bf16/fp16 parameter; param_groups in torch.optim.AdamW's keys (param_names included;
        see as_torch_groups), so that DCP moves a checkpoint to and from torch's."""
        with self._reading_state():
            self._live()
            as_torch_groups(self.param_groups)  # a math key a user set since, as it is saved
            self._not_mid_step("take a state dict", reads_state=True)
            self._finish()
            self._push_state_edits(keep=True)
            out = super().state_dict()  # reads self.state: the worker's, brought out once
            return out

    def load_state_dict(self, state_dict):
        """Load a state dict of this class or of torch.optim.AdamW (moments cast to fp32). The
        fp32 master of a bf16/fp16 parameter comes from "master_param" where the model holds
        what it rounds to at the next step (the model's checkpoint loaded before or after),
        else from the model. Everything is checked before anything
        changes: a refused state dict leaves the optimizer as it was."""
        with self._exclusive("load_state_dict"):
            forget(self)  # a GradScaler's attributes, if a step it began raised
            self._live()
            self._not_mid_step("load a state dict", torn_ok=True)
            self._finish()  # writes into optimizer.state since it was read: the load replaces them
            self._follow_moves()  # (accelerate's prepare() moves the model, then loads)
            state_dict = load_pre_hooks(self, state_dict)
            updates, prepared, entries = self._check_state_dict(state_dict)
            # applied whole: Ctrl-C (or a job's SIGTERM handler that raises) is held until the
            # last group has its state, not left with some groups loaded and others not
            with deferred_interrupts():
                self._apply_state_dict(updates, prepared, entries)
            load_post_hooks(self)

    def _apply_state_dict(self, updates, prepared, entries):
        """A checked state dict (_check_state_dict) into every group and the worker."""
        self._snapshot = None  # stale from here, even if applying fails midway
        for group, update in zip(self.param_groups, updates):
            apply_saved(group, update)
        for group, layout, ready in zip(self.param_groups, self._layouts, prepared):
            if layout is not None:
                self._apply_group_state(layout, ready)
                for slot, master in zip(layout.slots, ready[2]):
                    if master is not None:
                        # a load never changes the weights: the next step keeps the saved
                        # master only if the model holds what it rounds to (the model's
                        # checkpoint loaded too), as worker=False does
                        slot.seen = None
                continue
            for p, count in zip(group["params"], ready):
                self._set_count(p, count)
        for group, saved in zip(self.param_groups, entries):
            self._keep_extras(zip(group["params"], saved), cast=True)
        self._snapshot = None
        # every master, moment and count rewritten: a step begun in a failed backward is gone
        self._torn, self._stream, self._stream_scale = False, None, None

    def _check_state_dict(self, state_dict):
        """Each group's new settings and its state ready to apply, or an error naming what is
        wrong; nothing is changed here."""
        saved_groups, saved_state, updates = read_saved(self.param_groups, state_dict)
        prepared, loaded = [], []
        for i, (saved, layout) in enumerate(zip(saved_groups, self._layouts)):
            for slot in layout.slots if layout else ():
                slot.check_shape()  # a master may come from the model
            where = f"param group {i} of the state dict"
            entries = [saved_entry(saved_state, k, f"{where}, parameter {k!r}")
                       for k in saved["params"]]
            loaded.append(entries)
            if layout is None:  # no element here: only the step counts
                prepared.append([saved_step(e, f"{where}, parameter {k!r}")
                                 for k, e in zip(saved["params"], entries)])
                continue
            prepared.append(prepare_group_state(layout, entries, where, keys=saved["params"]))
        return updates, prepared, loaded

    def _apply_group_state(self, layout, prepared):
        self._gpu.settle()  # the masters may be what a copy to the GPU still reads
        moments, steps, masters = prepared
        for slot, master in zip(layout.slots, masters):
            if master is None:
                slot.load_from_model()
            else:
                slot.master.copy_(master.view_as(slot.master))
        for slot, count in zip(layout.slots, steps):
            self._set_count(slot.param, count)
        steps = [c or 0 for c in steps]
        count = max(steps, default=0)
        layout.group.load_state(moments, count)
        layout.set_ranges([count - c for c in steps])  # (and none idle)

    # -- lifetime ---------------------------------------------------------------------------

    @property
    def worker(self):
        """The zenflow_bind.Worker (pid, threads(), memory())."""
        return self._worker

    def close(self):
        """Finish the step in flight, give the parameters and gradients private memory again
        and stop the worker. The optimizer cannot step afterwards."""
        with self._exclusive("close"):
            self._close()

    def _close(self):
        if self._worker.closed:
            return
        stream, self._stream, self._stream_scale = self._stream, None, None
        try:
            if self._worker.forked:
                return  # a forked child's close: the step in flight is the parent's to finish
            if stream is not None:
                with deferred_interrupts():  # the driver queues nothing after the restore
                    try:
                        stream.close()  # a step begun during backward goes with the worker
                    except BaseException:  # noqa: B036 (closing: the worker goes anyway)
                        pass
                    self._restore_early()
            self._finish()
        finally:
            self._snapshot = None
            with self._ddp_lock:  # no reduced bucket is being copied into the buffers
                self._finalizer()

    def _live(self):
        if self._worker.closed:
            raise ZenbindError(-1, "this zenflow_bind.optim.AdamW was closed: its worker, and "
                                   "the optimizer state with it, are gone")
        self._worker._live()  # refuses a forked child before anything is copied
        groups = self.param_groups
        if len(groups) != len(self._held) or any(
                g["params"] is not params or tuple(map(id, params)) != ids
                for g, (params, ids) in zip(groups, self._held)):
            raise ValueError(
                "param_groups was edited in place (a group removed or replaced, or a parameter "
                "added to, removed from or replaced in a group's params): the worker holds each "
                "group's parameters as add_param_group() gave them. Put them back as they were; "
                "add a group with add_param_group(), and for other groups make a new optimizer")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_SLICE_MS = 200  # how long a wait goes without looking at Ctrl-C

# id(parameter) -> weakref to the optimizer whose worker holds its master weights. Not an
# attribute of the parameter: that would follow it into copy.deepcopy and break pickling.
_OWNERS = {}

# Holds True once the interpreter exits, before weakref runs the finalisers (_release).
_EXITING, _EXITING_HOOKED = [], []


def _now_ms():
    return time.monotonic() * 1000.0


_TORN = ("backward failed inside step_during_backward() after some buckets had taken the "
         "step: the worker holds a step the model never saw; load_state_dict() from a "
         "checkpoint to go on")

_AFTER_DEATH = ("the model holds its parameters from before this step; the Adam moments are "
                "gone with the worker: load the optimizer from your last checkpoint (a new "
                "optimizer would restart the moments)")


def _detail(error):
    return error.args[0].split(": ", 1)[-1]


def _not_applied(error):
    """The worker's error for a step of which the model took nothing."""
    return ZenbindError(error.code, f"{_detail(error)}; nothing of this step was applied to the "
                                    f"model: {_AFTER_DEATH}")


def _filling(optimizer_ref):
    """The gradient buffer backward fills now, or None when the optimizer is gone (for the
    backward hooks, which must not hold the optimizer)."""
    optimizer = optimizer_ref()
    return None if optimizer is None or optimizer._worker.closed else optimizer._buffer


def _runs(indices):
    """Consecutive runs of sorted group indices, as [first, end) pairs."""
    runs = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _landed(optimizer_ref, slot):
    """A backward hook copied slot's gradient: inside step_during_backward(), its bucket may go."""
    optimizer = optimizer_ref()
    if optimizer is not None and optimizer._stream_open and optimizer._stream is not None:
        optimizer._stream.land(slot)


def _release(layouts, worker, gpu):
    """close() and the finaliser: gradients back to private memory and their hooks removed, the
    buffers unpinned, then the worker stops. Holds no reference to the optimizer. Not the copy
    as the interpreter exits: no one reads them after, and a process that exits (a forked child
    that wrote a checkpoint) would pay their whole size; the buffers stay mapped while a view
    lives."""
    exiting = bool(_EXITING) or sys.is_finalizing()
    try:
        for layout in layouts:
            for slot in layout.slots if layout else ():
                slot.detach(own_grad=not exiting)
                _OWNERS.pop(id(slot.param), None)
        layouts[:] = [None] * len(layouts)
        gpu.release()
    finally:
        worker.close()
