"""Where each parameter of a torch param_group lives in its worker group, and the copies between
the model and the shared buffers: gradients in, updated parameters out.

A group's parameters are laid end to end in the worker's flat buffers (fp32 master params, two
gradient buffers in the gradient dtype, a copy-out in the model's 16-bit dtype), cut at parameter
boundaries into buckets, one worker group each, so that a bucket whose gradients have all landed
can be stepped while backward goes on (_stream.py). The model never
shares the memory the worker writes: the updated values are copied into it once a step has
completed, so a step that fails (a killed worker, Ctrl-C) leaves the model as it was before it,
never half updated. The gradients go the other way and may be shared: a CPU parameter whose dtype
is the gradient dtype gets its .grad pointed at its slice of the gradient buffer being filled, so
backward accumulates into shared memory in place (the worker only reads it). A DTensor parameter
(FSDP2's fully_shard) is its local shard here: each rank steps its own shard in its own worker,
and FSDP2 keeps owning the shard's memory."""

import functools
import weakref

import torch

from ._compile import eager
from ._native import MAX_GROUPS, ZenbindError
from ._signals import deferred_interrupts

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def local(tensor):
    """The elements this process holds: a DTensor's local shard, else the tensor itself."""
    shard = getattr(tensor, "_local_tensor", None)
    return tensor if shard is None else shard


def _identity(param):
    """Changes when the model's values may have: a write in place, or .data re-seated. A write
    through a DTensor (FSDP2: model.load_state_dict, copy_ under no_grad) counts on the DTensor's
    own version, not its local shard's: both are watched."""
    shard = local(param)
    return shard.data_ptr(), shard._version, param._version


class Slot:
    """One parameter: its offset in the group and tensor views of its slices, shaped like it."""

    def __init__(self, param, index, offset, group, at):
        self.param = param
        self.index = index  # its number in the optimizer's state dict, for messages
        self.offset = offset  # in the param group
        self.group, self.at = group, at  # its bucket's worker group, and its offset there
        shard = local(param)
        self.sharded = shard is not param
        self.device, self.dtype = shard.device, shard.dtype  # the buffers and hook are for these
        self.numel = shard.numel()
        shape = shard.shape
        cut = slice(at, at + self.numel)
        self.master = group.torch_view(group.params)[cut].view(shape)
        self.grads = [group.torch_view(g)[cut].view(shape) for g in group.grads]
        self.copy = (group.torch_view(group.copy_out)[cut].view(shape)
                     if group.copy_out is not None else None)
        on_cpu = shard.device.type == "cpu" and not self.sharded
        self.grad_alias = on_cpu and self.grads[0].dtype == param.dtype
        self.seen = None  # (data_ptr, _version) after our last write; another means a user write
        # (buffer, weakref to the gradient, its _version, the copy's CUDA event or None): what a
        # hook copied
        self.staged = None
        self.hook = None    # the handle of that hook (watch())
        self.ddp = False    # its gradient comes from DistributedDataParallel's reduction
        # (take_reduced()), not from the hook, which it replaces
        self.used = False   # backward gave it a gradient here since DDP last took it (marked
        self.use_hook = None  # by this hook, mark_use(): find_unused_parameters)
        self.watching = None  # watch()'s arguments, to watch again after a move
        self.early = None   # buffer k when its bucket went back early (_cuda.Gpu.early): its
        # gradient slot there holds the parameter's old values until the step is whole

    def load_from_model(self):
        """Take the model's values as the master weights."""
        p = self.param
        with torch.no_grad():
            self.master.copy_(local(p))
        self.seen = _identity(p)

    def moved(self):
        """Whether the parameter was moved or cast (Module.to() re-seats .data) since its
        buffers and hook were made for the device and dtype it had."""
        shard = local(self.param)
        return shard.device != self.device or shard.dtype != self.dtype

    def follow_move(self):
        """After a move to another device (the dtype kept): the hook and the gradient's aliasing
        are made for where the parameter is now. Its buffers are host memory either way: the
        master, the moments in the worker and the step counts stay as they are."""
        shard = local(self.param)
        self.device = shard.device
        self.grad_alias = self._aliasable()
        self.staged = None
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if self.watching is not None:
            self.watch(*self.watching)

    def _aliasable(self):
        """Whether its .grad can be its slice of the gradient buffer, where backward then
        accumulates: a CPU, unsharded parameter of the buffer's dtype whose .grad DDP does not
        write (reduced_by_ddp())."""
        shard = local(self.param)
        return shard.device.type == "cpu" and not self.sharded and \
            self.grads[0].dtype == shard.dtype and not self.ddp

    def check_shape(self):
        """The parameter's local tensor, unless it was given another shape (.data =). Its device
        and dtype are the layout's: every caller follows moves first (Layout.follow_moves),
        which refuses a cast."""
        shard = local(self.param)
        if shard.shape != self.master.shape:
            raise ValueError(f"parameter {self.index} was {list(self.master.shape)} and is now "
                             f"{list(shard.shape)}: an optimizer's parameters keep their "
                             "shape (make a new optimizer for a resized model)")
        return shard

    def refresh_if_changed(self):
        """A parameter the user wrote (load_state_dict, copy_) or re-seated (.data =) since our
        last write becomes the master again, unless it holds exactly what the master rounds to
        (a checkpoint of the model and of the optimizer with its fp32 master, loaded in either
        order): then the master keeps the bits a 16-bit parameter lacks."""
        p = self.param
        shard = self.check_shape()
        if _identity(p) == self.seen:
            return
        if shard.dtype != torch.float32 and \
                torch.equal(self.master.to(shard.dtype), shard.detach().to("cpu")):
            self.seen = _identity(p)
        else:
            self.load_from_model()

    def stage_grad(self, k, again=False):
        """Put the gradient into buffer k; False if the parameter has none (then its slice is
        zeroed: the worker steps whole groups, and a zero slice keeps the global norm right). A
        gradient the backward hook already copied there, unchanged since, is not copied again,
        unless `again` (it may have changed without its version counter saying so)."""
        p, dst = self.param, self.grads[k]
        g, staged, self.staged = p.grad, self.staged, None
        if g is None:
            dst.zero_()
            return False
        if g.is_sparse:
            raise RuntimeError("zenflow_bind.optim.AdamW does not support sparse gradients")
        copied = not again and self._still_staged(staged, k, g)
        if not copied and g.data_ptr() != dst.data_ptr():
            self._copy_grad(g, dst)
        return True

    def _copy_grad(self, g, dst):
        dst.copy_(local(g))
        if self.grad_alias:  # from now on backward accumulates in shared memory
            self.param.grad = shared_grad(dst)

    def streamable(self):
        """Whether its gradient is copied during backward: by watch()'s hook, or as DDP's
        reduction of it completes (take_reduced())."""
        return self.hook is not None or self.ddp

    def reduced_by_ddp(self):
        """From now on its gradient is the one DistributedDataParallel averages: taken when its
        reduction completes (take_reduced()), no longer by the hook, whose copy (made before the
        average) DDP would overwrite."""
        self.ddp = True
        # DDP writes .grad after backward (without bucket views): into memory of its own, not
        # a slice of the buffer whose views share one version counter
        self.grad_alias = False
        self._own_grad()
        if self.hook is not None:
            self.hook.remove()
            self.hook = None

    def leave_ddp(self):
        """The DDP model its gradient came from is gone: the hook again (watch()), and no use
        noted for that model, until another DDP model takes it (reduced_by_ddp())."""
        if self.use_hook is not None:
            self.use_hook.remove()
            self.use_hook = None
        self.ddp = self.used = False
        self.grad_alias = self._aliasable()  # the next copy makes .grad its slice again
        if self.watching is not None:
            self.watch(*self.watching)

    def mark_use(self, model):
        """Note each gradient a backward that DDP `model` reduces computes for the parameter on
        this rank (used): DDP with find_unused_parameters=True copies the average into the .grad
        of a parameter used on some rank, and only then, so one used here gets that copy for
        certain. Not under no_sync(): before torch 2.4 DDP does not count those uses (a
        parameter used there alone keeps its .grad)."""
        if self.use_hook is None and self.param.requires_grad:
            self.use_hook = self.param.register_hook(
                functools.partial(_used_hook, weakref.ref(self), weakref.ref(model)))

    def take_reduced(self, k, src, writes_after, gpu):
        """DDP reduced this parameter's gradient: src, its slice of the reduced bucket, into
        buffer k (a CUDA one through gpu's copy stream), recorded as staged for the gradient
        the parameter will hold after backward, which DDP writes `writes_after` more times (1:
        it copies the bucket into .grad, 0: .grad is the bucket's view). False if the
        parameter has no gradient to take (a globally unused one, or one moved since)."""
        g = self.param.grad
        if g is None or g.is_sparse or self.moved():
            return False
        dst, event = self.grads[k], None
        if src.device.type == "cuda":
            event = gpu.grad_out(src, dst, unless_early=self)
            if event is None:  # its bucket went back: landing again is what step() refuses
                return True
        elif src.data_ptr() != dst.data_ptr():
            with torch.no_grad():
                dst.copy_(src)
        g = self.param.grad  # (dst may be it: CPU, DDP without bucket views)
        self.staged = (k, weakref.ref(g), g._version + writes_after, event, g.data_ptr())
        return True

    def can_go_early(self, k):
        """Whether its gradient slot in buffer k can hold its values (a CUDA parameter of the
        gradient's dtype), so that its bucket can go back to the GPU before the step is whole."""
        shard = local(self.param)
        return shard.device.type == "cuda" and not self.sharded and \
            self.grads[k].dtype == shard.dtype

    def unchanged_since_staged(self, k):
        """The gradient backward gave it, copied into buffer k by the hook, not written since."""
        return self._still_staged(self.staged, k, self.param.grad)

    @staticmethod
    def _still_staged(staged, k, g):
        """Whether g is the tensor the hook copied into buffer k, unchanged since: the same
        object, version and memory (p.grad.data = x re-seats it without a version)."""
        return staged is not None and g is not None and staged[0] == k and \
            staged[1]() is g and staged[2] == g._version and staged[4] == g.data_ptr()

    def watch(self, buffer_now, landed=None, gpu=None):
        """Copy the gradient into the buffer being filled as soon as backward has accumulated
        it (torch >= 2.1: a post-accumulate-grad hook), while it is still in the caches and
        backward goes on; step() then finds it there. buffer_now() says which buffer, or None
        once the optimizer is gone; landed(slot), when given, is told after each copy. A CUDA
        gradient's copy is queued on gpu's copy stream (_cuda.Gpu), and backward does not wait
        for it. Not for a DTensor shard, whose gradient is FSDP2's: FSDP2 runs the hook once it
        has set the shard's gradient (torch 2.6 and 2.14), but an edit after backward through
        a foreach op (clip_grad_norm_'s _foreach_mul_) bumps neither the DTensor's version nor
        its local tensor's (torch 2.14), so a copy made then could not be told stale. Nor for a
        non-leaf tensor that retains its gradient (torch has no such hook for it): step()
        copies theirs."""
        p = self.param
        self.watching = (buffer_now, landed, gpu)
        if self.ddp:
            return
        register = getattr(p, "register_post_accumulate_grad_hook", None)
        device = local(p).device.type
        if register is None or self.sharded or not p.requires_grad or not p.is_leaf or \
                not (device == "cpu" or (device == "cuda" and gpu is not None and gpu.active)):
            return  # (a frozen parameter's gradient, if any, is set by hand)

        # a partial of one module-level function: torch.compile runs it eagerly (eager), and
        # removing the hook frees the slot at once (no per-hook cycle for the collector)
        self.hook = register(functools.partial(_landed_hook, self, buffer_now, landed, gpu,
                                               device))

    def write_back(self, gpu=None):
        """Bring the updated parameters of a completed step into the model (a CUDA one through
        gpu's copy stream), unless its bucket went back during backward (early)."""
        p = self.param
        if self.early is not None:
            self.early, self.seen = None, _identity(p)
            return
        # a copy-out exists only when the whole group has the parameter's 16-bit dtype
        src = self.copy if self.copy is not None else self.master
        with torch.no_grad():
            if gpu is not None and gpu.active and local(p).device.type == "cuda":
                gpu.param_back(local(p), src)
            else:
                local(p).copy_(src)
        self.seen = _identity(p)

    def detach(self, own_grad=True):
        """Give the gradient private memory again (before the worker goes; unless not
        own_grad), and stop watching."""
        for hook in (self.hook, self.use_hook):
            if hook is not None:
                hook.remove()
        self.hook = self.use_hook = None
        if own_grad:
            self._own_grad()

    def _own_grad(self):
        """A .grad that is a slice of our gradient buffers gets private memory (a copy)."""
        p = self.param
        g = p.grad
        if g is not None and g.layout == torch.strided and \
                any(g.data_ptr() == mine.data_ptr() for mine in self.grads):
            p.grad = g.clone()  # (a sparse gradient has no data pointer: never one of ours)


def shared_grad(buffer):
    """A parameter's .grad over its slice of a shared gradient buffer: a tensor of its own, so
    that user code re-seating it (p.grad.data = x, as gradient masking does) re-seats that
    tensor, never the slot's view, which the worker's slice must stay; and not a view, which
    torch would not let a hand-written zero_grad detach_() in place."""
    with torch.no_grad():
        return torch.empty(0, dtype=buffer.dtype).set_(
            buffer.untyped_storage() if hasattr(buffer, "untyped_storage") else buffer.storage(),
            buffer.storage_offset(), buffer.shape, buffer.stride())


def check_dtype(slot, shard):
    """The gradient buffers and the copy-out were made for the dtype the parameter had when its
    group was added: a parameter cast since (model.half()) is refused, saying so (one moved to
    another device is followed: Layout.follow_moves)."""
    if shard.dtype != slot.dtype:
        raise ValueError(f"parameter {slot.index} was {slot.dtype} when its param group was "
                         f"added and is now {shard.dtype}: make the optimizer after casting "
                         "the model, or make a new one and load this one's state dict into "
                         "it (a model moved to another device is followed, not one cast)")


@eager  # dynamo would trace it under torch.compile
def _landed_hook(slot, buffer_now, landed, gpu, device, p):
    """Slot.watch's post-accumulate-grad hook: p's gradient into the buffer being filled."""
    k = buffer_now()
    g = p.grad
    if k is None or g is None or g.is_sparse:
        return
    if slot.moved():  # step() follows a move (or refuses a cast), then copies the gradient
        return
    dst, event = slot.grads[k], None
    if device == "cuda":
        # None once its bucket went back (landing again is an error step() raises, and the
        # slot keeps the old values)
        event = gpu.grad_out(g, dst, unless_early=slot)
        if event is None:
            if landed is not None:
                landed(slot)
            return
    elif g.data_ptr() != dst.data_ptr():
        slot._copy_grad(g, dst)
    g = p.grad
    slot.staged = (k, weakref.ref(g), g._version, event, g.data_ptr())
    if landed is not None:
        landed(slot)


@eager
def _used_hook(slot_ref, model_ref, grad):
    """Slot.mark_use's gradient hook: the parameter was used in this backward, here."""
    slot, model = slot_ref(), model_ref()
    if slot is not None and model is not None and model.require_backward_grad_sync:
        slot.used = True


def _remove(slots, groups):
    """Gradients back to private memory and hooks removed, then the worker groups removed,
    newest first: their memory leaves both processes."""
    for s in slots:
        s.detach()
    for group in reversed(groups):
        try:
            group.remove()
        except ZenbindError:  # the worker is gone or stopped: it holds nothing any more
            break


class Buckets:
    """A param group's worker groups, one per bucket, seen as one: hyperparameters and state."""

    def __init__(self, groups):
        self.groups = groups
        self.numel = sum(g.numel for g in groups)
        self.hyper = groups[0].hyper  # every bucket's is set together

    def set_hyper(self, **hyper):
        for g in self.groups:
            g.set_hyper(**hyper)

    def load_state(self, ranges, step):
        """The moments from ranges (offset, numel, exp_avg, exp_avg_sq) of the param group,
        sorted, each inside one bucket (a parameter is never cut); zeros elsewhere."""
        at, i = 0, 0
        for g in self.groups:
            mine = []
            while i < len(ranges) and ranges[i][0] < at + g.numel:
                offset, numel, m, v = ranges[i]
                mine.append((offset - at, numel, m, v))
                i += 1
            g.load_state(mine, step)
            at += g.numel


# At most this many buckets per param group.
MAX_BUCKETS = 16
# A worker holds MAX_GROUPS groups; param groups registered while fewer than RESERVED are free get
# one bucket each, so that that many more param groups always fit, however large the first.
RESERVED = MAX_GROUPS // 2


def bucket_limit(used):
    """How many buckets a param group may take when `used` worker groups are taken."""
    return max(1, min(MAX_BUCKETS, (MAX_GROUPS - RESERVED - used) // 8))


def cut_buckets(sizes, elements, limit=MAX_BUCKETS):
    """[first, end) slot ranges: consecutive parameters, at least `elements` elements each but
    the last (a parameter is never cut), at most `limit` of them."""
    elements = max(int(elements), -(-sum(sizes) // max(limit, 1)), 1)
    cuts, first, filled = [], 0, 0
    for i, n in enumerate(sizes):
        filled += n
        if filled >= elements:
            cuts.append((first, i + 1))
            first, filled = i + 1, 0
    if first < len(sizes):
        if filled or not cuts:
            cuts.append((first, len(sizes)))
        else:  # only parameters without elements left: the last bucket takes them (a worker
            cuts[-1] = (cuts[-1][0], len(sizes))  # group holds at least one element)
    return cuts


class Layout:
    """One torch param_group in one worker group per bucket."""

    def __init__(self, worker, params, hyper, first_index=0, bucket_elements=1 << 24,
                 grad_buffers=2):
        for p in params:
            if p.dtype not in DTYPE_NAMES:
                raise TypeError(f"zenflow_bind.optim.AdamW optimizes fp32, bf16 and fp16 "
                                f"parameters, not {p.dtype}")
        dtypes = {p.dtype for p in params}
        # One 16-bit dtype: gradients in it, and a copy-out in it for the model. Mixed dtypes in
        # one group: fp32 gradients, and each parameter converts from the fp32 master.
        grad = DTYPE_NAMES[dtypes.pop()] if len(dtypes) == 1 else "fp32"
        copy_out = grad if grad != "fp32" else None
        sizes = [local(p).numel() for p in params]
        self.slots, self.buckets, offset = [], [], 0
        groups = []
        try:
            for first, end in cut_buckets(sizes, bucket_elements,
                                          bucket_limit(len(worker.groups))):
                group = worker.add_group(sum(sizes[first:end]), grad=grad, copy_out=copy_out,
                                         grad_buffers=grad_buffers, **hyper)
                groups.append(group)
                bucket, at = [], 0
                for i in range(first, end):
                    bucket.append(Slot(params[i], first_index + i, offset, group, at))
                    offset += sizes[i]
                    at += sizes[i]
                self.slots += bucket
                self.buckets.append(bucket)
            self.group = Buckets(groups)
            for s in self.slots:
                s.load_from_model()
        except BaseException:
            with deferred_interrupts():
                _remove(self.slots, groups)
            raise
        self.behind = [0] * len(self.slots)  # steps each parameter took fewer than the group
        self.ranges = [[] for _ in groups]  # each bucket's ranges as its worker group has them

    def follow_moves(self, gpu):
        """Parameters moved to another device since the layout was made (Module.to() after the
        optimizer was made, as the Hugging Face Trainer and accelerate's prepare() do with the
        model they are given) are followed: the buffers are pinned for CUDA, and each moved
        slot watches where its parameter is now. A cast, or a second GPU, is refused before
        anything changes."""
        moved = [s for s in self.slots if s.moved()]
        for s in moved:
            check_dtype(s, local(s.param))
        if moved:
            gpu.adopt(self)
        for s in moved:
            s.follow_move()

    def remove(self):
        """Undo the layout, so that the worker holds what it held before (a param group that
        could not be added). Nothing of the layout may be used after."""
        _remove(self.slots, self.group.groups)
        self.slots, self.buckets = [], []

    def set_ranges(self, behind=None, idle=None):
        """torch counts steps per parameter and leaves one without a gradient alone; the worker
        steps and counts whole groups. behind[i]: how many steps slot i took fewer than the
        group (None: as last given); idle[i]: the next steps leave it alone (None: none). Each
        bucket whose ranges change is told (one round trip)."""
        if behind is not None:
            self.behind = list(behind)
        i = 0
        for b, (group, bucket) in enumerate(zip(self.group.groups, self.buckets)):
            table, at = [], 0
            for slot in bucket:
                lag, still = self.behind[i], bool(idle and idle[i])
                i += 1
                lag = 0 if still else lag  # an idle range's lag is not read: keep it constant
                last = table[-1] if table else None
                if last and last[2:] == (lag, still) and last[0] + last[1] == at:
                    table[-1] = (last[0], last[1] + slot.numel, lag, still)
                elif (lag or still) and slot.numel:
                    table.append((at, slot.numel, lag, still))
                at += slot.numel
            if table != self.ranges[b]:
                group.set_ranges(table)
                self.ranges[b] = table

    def stepped(self, has):
        """A step counted: the parameters without a gradient in it (has[i] false), idle, fell one
        step further behind the group (the worker keeps them idle until told otherwise)."""
        if not all(has):
            self.behind = [b + (not h) for b, h in zip(self.behind, has)]

    def idle(self, b):
        """Whether the worker leaves a parameter of bucket b idle."""
        return any(r[3] for r in self.ranges[b])

    @property
    def numel(self):
        return self.group.numel

    def switch_grads(self, k):
        """Buffer 1 - k takes buffer k's gradients."""
        for g in self.group.groups:
            g.torch_view(g.grads[1 - k]).copy_(g.torch_view(g.grads[k]))
