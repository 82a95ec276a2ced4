"""DistributedDataParallel's averaged gradients, taken as each of its buckets is reduced:
optimizer.register_ddp(ddp_model).

DDP averages a gradient after backward produced it: its reducer copies the gradient into a bucket
(or backward accumulated into the bucket: gradient_as_bucket_view), reduces the bucket across the
ranks through its communication hook, and, once every bucket is done, copies the result into .grad
(unless .grad is the bucket's view). A post-accumulate-grad hook sees the gradient before all
that: its copy is dropped, and step() copies the average again after backward. Registered as
DDP's communication hook, this module runs the reduction DDP would have run (its own, or the one
given), then copies each parameter's share of the reduced bucket into the worker's buffer as soon
as the bucket is done, while backward goes on: one copy per gradient, and a bucket of ours whose
gradients have all been reduced can be stepped during backward (_stream.py).

The copy is recorded as staged for the .grad the parameter holds once DDP is done with it (the
version DDP's own copy gives it), so that step() copies nothing again unless the gradient was
written after backward (clip_grad_norm_, GradScaler.unscale_): then it takes the new values, as
without DDP. A backward under no_sync() reduces nothing: step() copies what it finds."""

import functools
import weakref

import torch
import torch.distributed as dist

from ._compile import eager


def checked(model, hook, state):
    """register_ddp()'s arguments checked: the hook to run and its state (None: DDP's own)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"register_ddp() takes the torch.nn.parallel.DistributedDataParallel "
                        f"that wraps the model, not a {type(model).__name__}")
    if hook is None and state is not None:
        raise ValueError("register_ddp(state=) is the state of the hook= given with it; without "
                         "hook=, DDP's averaging over the model's process group runs")
    if hook is not None and not callable(hook):
        raise TypeError(f"register_ddp(hook=) takes a DDP communication hook, hook(state, "
                        f"bucket) -> torch.futures.Future, not a {type(hook).__name__}")
    return hook, state


def register(optimizer, model, hook, state):
    """Make `hook` (DDP's averaging by default) model's communication hook, followed by the copy
    of each reduced gradient into optimizer's worker buffer. An optimizer registered with a DDP
    model gone since (the Hugging Face Trainer wraps the module anew after an out-of-memory
    retry of auto_find_batch_size) takes the new one's."""
    hook, state = checked(model, hook, state)
    if hook is None:
        hook, state = _average, model.process_group
    # What DDP's reducer takes, named as it names them ("module.param", ".param" at the top)
    # against the names it was told to leave alone
    ignored = getattr(model, "parameters_to_ignore", ())
    reduced = {id(p): weakref.ref(p) for prefix, module in model.module.named_modules()
               for name, p in module.named_parameters(recurse=False)
               if p.requires_grad and f"{prefix}.{name}" not in ignored}
    mine = [s for layout in optimizer._layouts if layout is not None for s in layout.slots
            if id(s.param) in reduced]
    if not mine:
        raise ValueError("none of the DDP model's parameters is optimized by this optimizer: "
                         "give register_ddp() the model whose parameters it was made with")
    taker = _TAKERS.get(model)
    if taker is None:
        taker = _Taker(model, hook, state, optimizer)
        # DDP refuses a second hook (before this optimizer changes anything)
        model.register_comm_hook(state, taker)
        _TAKERS[model] = taker
    else:  # a hook of ours: taken over from an optimizer closed or gone (a resume)
        before = taker.optimizer()
        if before is not None and not before._worker.closed:
            raise RuntimeError("this DDP model's gradients are taken by another zenflow_bind."
                               "optim.AdamW, still open (DDP takes one communication hook): "
                               "close() that one first")
        taker.retarget(hook, state, optimizer)
    for slot in optimizer._ddp_slots.values():  # those of a DDP model gone since
        slot.leave_ddp()
    optimizer._ddp_reduced, optimizer._ddp_slots = reduced, {}
    optimizer._ddp_model = weakref.ref(model)
    for slot in mine:
        adopt(optimizer, slot)


class _Taker:
    """A DDP model's communication hook, registered once: the reduction, then the copy of its
    result into the optimizer's buffer. An optimizer made for the model later (to resume after
    its worker died) takes it over; the state DDP passes is the first registration's, so the
    reduction's own is kept here."""

    def __init__(self, model, hook, state, optimizer):
        self.model = weakref.ref(model)
        self.retarget(hook, state, optimizer)
        # DDP logs a hook by its name, and checks by it that the NCCL it runs on can take bf16
        self.__name__ = getattr(hook, "__name__", type(hook).__name__)
        self.__qualname__ = getattr(hook, "__qualname__", self.__name__)

    def retarget(self, hook, state, optimizer):
        self.hook, self.state, self.optimizer = hook, state, weakref.ref(optimizer)

    def __call__(self, state, bucket):  # (DDP wants these names)
        buffer = bucket.buffer()
        if buffer.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True)):
            return self.hook(self.state, bucket)  # another optimizer's, never ours
        model = self.model()
        if self.hook is _average and model is not None and _active_ranks_divide(model):
            raise RuntimeError("register_ddp()'s averaging divides by the number of ranks; DDP's "
                               "join(divide_by_initial_world_size=False) divides by those still "
                               "training, which a communication hook cannot know: join with "
                               "divide_by_initial_world_size=True (DDP's default)")
        future = self.hook(self.state, bucket)
        # Views of the bucket's buffer, one per parameter, taken now: the bucket object is
        # DDP's and is only valid inside the hook.
        params = list(zip(bucket.parameters(), bucket.gradients()))
        # Without bucket views DDP copies the bucket into each .grad at the end of backward:
        # once into every one it has, unless it may find a parameter unused on every rank
        # (whose .grad it leaves alone): then into those used here for certain (Slot.used)
        once = model is not None and not model.find_unused_parameters
        return future.then(functools.partial(_take, self.optimizer, params, buffer, once))


# DDP model -> its _Taker
_TAKERS = weakref.WeakKeyDictionary()


def adopt(optimizer, slot):
    """slot's gradient is taken from DDP's reduction, if its parameter is one DDP reduces (a
    param group added after register_ddp() too)."""
    ref = optimizer._ddp_reduced.get(id(slot.param))
    if ref is not None and ref() is slot.param:
        slot.reduced_by_ddp()
        model = optimizer._ddp_model()
        # without bucket views, under find_unused_parameters: uses noted (Slot.mark_use)
        if model is not None and model.find_unused_parameters and \
                not getattr(model, "gradient_as_bucket_view", False):
            slot.mark_use(model)
        optimizer._ddp_slots[id(slot.param)] = slot


def _average(group, bucket):
    """DDP's own reduction: the bucket divided by the number of ranks, then summed over them."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(_first)


def _first(future):
    """A collective's future holds a list of tensors; DDP takes a hook's tensor."""
    return future.value()[0]


def _active_ranks_divide(model):
    """Whether DDP divides by the ranks still training (join(divide_by_initial_world_size=
    False)), not by the number of ranks."""
    join = getattr(model, "_join_config", None)
    return bool(join is not None and join.enable and
                not getattr(model, "_divide_by_initial_world_size", True))


@eager
def _take(optimizer_ref, params, buffer, once, future):
    """The reduced bucket, returned to DDP after its gradients went to the worker."""
    result = future.value()
    if isinstance(result, (list, tuple)):  # (a hook's Future[List[Tensor]], as c10d's are)
        result = result[0]
    if result.data_ptr() != buffer.data_ptr():
        # DDP would copy it into the bucket at the end of backward: now, once, so that every
        # parameter's share is its view of the bucket, and DDP copies nothing more into a .grad
        # that is one (gradient_as_bucket_view)
        if result.numel() != buffer.numel():
            raise RuntimeError(f"the DDP communication hook returned {result.numel()} elements "
                               f"for a bucket of {buffer.numel()}: register_ddp() takes a hook "
                               "whose result is the reduced bucket, laid out as the bucket")
        buffer.copy_(result.view(buffer.shape))
        result = buffer
    optimizer = optimizer_ref()
    if optimizer is not None:
        optimizer._take_reduced(params, once)
    return result


def take(optimizer, k, params, once, landed):
    """Each of the optimizer's parameters in a reduced bucket into gradient buffer k; landed(slot)
    after each (inside step_during_backward(), its bucket may go). A gradient whose writes by DDP
    after backward cannot be told from an edit is left to step() to copy."""
    slots = optimizer._ddp_slots
    for p, view in params:
        slot = slots.get(id(p))
        if slot is None or slot.param is not p:
            continue
        used, slot.used = slot.used, False  # (marked in this backward)
        g = p.grad
        if g is None:
            continue
        if g.data_ptr() == view.data_ptr():
            writes_after = 0  # .grad is the bucket's view (gradient_as_bucket_view)
        elif (once or used) and _alone(g):
            writes_after = 1  # DDP's copy into .grad
        else:
            continue
        if slot.take_reduced(k, view, writes_after, optimizer._gpu):
            landed(slot)


def _alone(grad):
    """Whether grad is the whole of its memory, so that no write to another tensor moves its
    version counter: the gradients of weights concatenated in forward are slices of one tensor
    (detached: no views, yet one counter), which DDP's copies into the others move too."""
    storage = grad.untyped_storage() if hasattr(grad, "untyped_storage") else grad.storage()
    return grad.storage_offset() == 0 and storage.nbytes() == grad.numel() * grad.element_size()

