"""Hugging Face transformers' Trainer with zenflow_bind.optim.AdamW: the callback it needs.

    trainer = Trainer(..., optimizers=(opt, scheduler),
                      callbacks=[zenflow_bind.hf.Synchronize()])

Under DDP (torchrun, several processes) the Trainer wraps the model in DistributedDataParallel
inside train(), through accelerate, where the user cannot reach the wrapper to call
opt.register_ddp(): the callback does, at the model's first training forward inside it (the one
moment the wrapper shows itself: DDP names the module it is running), so that each gradient is
taken from DDP's reduction during backward, not copied again after it (zenflow_bind.optim(3),
DISTRIBUTED DATA PARALLEL), unless edited after backward: transformers 5 multiplies every .grad
by 1 for the norm it logs (zenflow_bind.optim(3), HUGGING FACE TRAINER). It does so for an
optimizer that holds CUDA parameters: a CPU parameter's gradient is already where the worker
reads it (Synchronize(register_ddp=True or False) decides otherwise). A communication hook
given to DDP another way is DDP's one hook: the callback warns and the gradients go as without
it.

In overlap mode the model holds the weights of the step before the last one until the optimizer
synchronizes (zenflow_bind.optim(3), OVERLAP). The Trainer reads the model between steps: it saves
a checkpoint (the model's file before the optimizer's state, which would then be a step apart)
and evaluates, after a step or at an epoch's end, and a user saves or evaluates after train()
returns. Synchronize has the optimizer finish the step in flight wherever the Trainer is about to
do either, and when training ends. A checkpoint is then whole and a run resumed from it ends where
an uninterrupted one does. Not covered: the checkpoints transformers' JIT checkpointing
(enable_jit_checkpoint) writes from its own callbacks, which run before this one. Without
overlap=True that part changes nothing: a blocking step leaves nothing in flight.

The Trainer hands the callback the optimizer it was given; one the Trainer makes itself
(optimizer_cls_and_kwargs) is not handed over: give it, Synchronize(optimizer), once made.
"""

import warnings
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

from ._compile import eager
from ._layout import local

__all__ = ["Synchronize"]


def _ours(optimizer):
    """The zenflow_bind optimizer inside what the Trainer holds (accelerate wraps it), or None."""
    for _ in range(8):  # wrappers keep the one they wrap as .optimizer
        if optimizer is None or callable(getattr(optimizer, "synchronize", None)):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return None


def _open_worker(ours):
    """Whether ours is a worker's optimizer, open (worker=False has no worker, and reads .grad
    after DDP's reduction: nothing to take)."""
    worker = getattr(ours, "worker", None)  # (_ours(): a zenflow_bind optimizer)
    return worker is not None and not worker.closed


def _on_cuda(ours):
    """Whether ours holds a CUDA parameter: the gradients register_ddp() saves a transfer for.
    A CPU one's gradient is its slice of the shared buffer, where DDP writes the average and
    step() copies nothing: registering would copy each (for steps during backward, which the
    Trainer does not take)."""
    return any(local(p).is_cuda for group in ours.param_groups for p in group["params"])


def _take_from_ddp(ours, model, when):
    """ours.register_ddp(the DistributedDataParallel that runs model), at model's first forward
    inside it in training mode: the wrapper exists by then. Forwards outside it (an evaluation,
    a pass of the unwrapped model) are passed over; a train() that fails before leaves the hook
    on the model, holding the optimizer weakly, and it does nothing once that one is closed or
    gone. when(ours) decides, then, whether to register. Returns the hook's handle."""
    ours = weakref.ref(ours)

    def inside_ddp(module, inputs):  # (traced under torch.compile: all but the call is cheap)
        # the DDP running this forward (torch 1.13 to 2.14 name it, for dynamo)
        ddp = getattr(DistributedDataParallel, "_active_ddp_module", None)
        if ddp is not None and ddp.module is module and module.training:
            handle.remove()
            _register(ours(), ddp, when)

    handle = model.register_forward_pre_hook(inside_ddp)
    return handle


@eager
def _register(ours, ddp, when):
    """ours.register_ddp(ddp), unless ours takes its gradients already (a train() again). A
    new DDP around the module (auto_find_batch_size wraps it anew after an out-of-memory
    error) is registered in turn once the one before is gone."""
    if ours is None or not _open_worker(ours) or not when(ours) or \
            (ours._takes_ddp() and ours._ddp_model() is ddp):
        return
    try:
        ours.register_ddp(ddp)
    except (RuntimeError, ValueError) as e:  # another communication hook, say
        warnings.warn(f"zenflow_bind.hf.Synchronize: the DDP gradients are taken after "
                      f"backward, as without register_ddp(): {e}", stacklevel=3)


class Synchronize(TrainerCallback):
    """Has the optimizer take DDP's gradients as DDP reduces them, and finishes the optimizer's
    step in flight before the Trainer saves, evaluates or stops. optimizer: the zenflow_bind
    optimizer, where the Trainer does not hand it to callbacks. register_ddp: None registers
    an optimizer that holds CUDA parameters (see _on_cuda), True and False any or none."""

    def __init__(self, optimizer=None, register_ddp=None):
        if register_ddp not in (None, True, False):
            raise TypeError(f"register_ddp is None, True or False, not {register_ddp!r}")
        self.optimizer = optimizer
        self.register_ddp = register_ddp
        self._watch = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        ours = _ours(self.optimizer or optimizer)
        if ours is None:
            warnings.warn("zenflow_bind.hf.Synchronize: no zenflow_bind optimizer reached the "
                          "callback (the Trainer made its own?): give it, "
                          "Synchronize(optimizer); until then checkpoints may hold a model a "
                          "step behind the optimizer", stacklevel=2)
            return
        self._stop_watching()
        # DDP needs a process group: a single process gets no hook
        if isinstance(model, torch.nn.Module) and _open_worker(ours) and \
                self.register_ddp is not False and dist.is_available() and dist.is_initialized():
            self._watch = _take_from_ddp(ours, model, self._registers)

    def _registers(self, ours):
        """Whether ours is to take DDP's gradients (register_ddp of __init__)."""
        return _on_cuda(ours) if self.register_ddp is None else self.register_ddp

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if control.should_save or control.should_evaluate or control.should_training_stop:
            self._synchronize(optimizer)

    def on_epoch_end(self, args, state, control, optimizer=None, **kwargs):
        self._synchronize(optimizer)  # epoch strategies save and evaluate right after

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        self._stop_watching()
        self._synchronize(optimizer)

    def _stop_watching(self):
        if self._watch is not None:
            self._watch.remove()
            self._watch = None

    def _synchronize(self, optimizer):
        ours = _ours(self.optimizer or optimizer)
        if ours is not None:
            ours.synchronize()
