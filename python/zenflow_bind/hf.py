"""Hugging Face transformers' Trainer with zenflow_bind.optim.AdamW(overlap=True).

In overlap mode the model holds the weights of the step before the last one until the optimizer
synchronizes (zenflow_bind.optim(3), OVERLAP). The Trainer reads the model between steps: it saves
a checkpoint (the model's file before the optimizer's state, which would then be a step apart)
and evaluates, after a step or at an epoch's end, and a user saves or evaluates after train()
returns. Synchronize has the optimizer finish the step in flight wherever the Trainer is about to
do either, and when training ends:

    trainer = Trainer(..., optimizers=(opt, scheduler),
                      callbacks=[zenflow_bind.hf.Synchronize()])

A checkpoint is then whole and a run resumed from it ends where an uninterrupted one does. The
Trainer hands the callback the optimizer it was given; one the Trainer makes itself
(optimizer_cls_and_kwargs) is not handed over: give it, Synchronize(optimizer), once made. Not
covered: the checkpoints transformers' JIT checkpointing (enable_jit_checkpoint) writes from its
own callbacks, which run before this one. Without overlap=True it changes nothing: a blocking step
leaves nothing in flight.
"""

import warnings

from transformers import TrainerCallback

__all__ = ["Synchronize"]


def _ours(optimizer):
    """The zenflow_bind optimizer inside what the Trainer holds (accelerate wraps it), or None."""
    for _ in range(8):  # wrappers keep the one they wrap as .optimizer
        if optimizer is None or callable(getattr(optimizer, "synchronize", None)):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return None


class Synchronize(TrainerCallback):
    """Finishes the optimizer's step in flight before the Trainer saves, evaluates or stops.
    optimizer: the zenflow_bind optimizer, where the Trainer does not hand it to callbacks."""

    def __init__(self, optimizer=None):
        self.optimizer = optimizer

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if _ours(self.optimizer or optimizer) is None:
            warnings.warn("zenflow_bind.hf.Synchronize: no zenflow_bind optimizer reached the "
                          "callback (the Trainer made its own?): give it, "
                          "Synchronize(optimizer); until then checkpoints may hold a model a "
                          "step behind the optimizer", stacklevel=2)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if control.should_save or control.should_evaluate or control.should_training_stop:
            self._synchronize(optimizer)

    def on_epoch_end(self, args, state, control, optimizer=None, **kwargs):
        self._synchronize(optimizer)  # epoch strategies save and evaluate right after

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        self._synchronize(optimizer)

    def _synchronize(self, optimizer):
        ours = _ours(self.optimizer or optimizer)
        if ours is not None:
            ours.synchronize()
