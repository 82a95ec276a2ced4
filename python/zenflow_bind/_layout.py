"""Where each parameter of a torch param_group lives in its worker group, and the copies between
the model and the shared buffers: gradients in, updated parameters out.

A group's parameters are laid end to end in the worker's flat buffers (fp32 master params, two
gradient buffers in the gradient dtype, a copy-out in the model's 16-bit dtype). Where the model
can use that memory directly it does, so no copy is made:
  - a CPU fp32 parameter's .data is its slice of the fp32 master (blocking mode only: in overlap
    mode the worker writes the master while the next forward pass reads the model);
  - a CPU bf16/fp16 parameter's .data is its slice of the copy-out (blocking mode only, as above);
  - a CPU parameter whose dtype is the gradient dtype gets its .grad pointed at its slice of the
    gradient buffer being filled, so backward accumulates into shared memory in place.
Everything else (other devices, mixed dtypes in one group, overlap mode, DTensor shards) is
copied. A DTensor parameter (FSDP2's fully_shard) is its local shard here: each rank steps its own
shard in its own worker, and FSDP2 keeps owning the shard's memory."""

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def local(tensor):
    """The elements this process holds: a DTensor's local shard, else the tensor itself."""
    shard = getattr(tensor, "_local_tensor", None)
    return tensor if shard is None else shard


class Slot:
    """One parameter: its offset in the group and tensor views of its slices, shaped like it."""

    def __init__(self, param, index, offset, group, alias_params):
        self.param = param
        self.index = index  # its number in the optimizer's state dict, for messages
        self.offset = offset
        shard = local(param)
        self.sharded = shard is not param
        self.numel = shard.numel()
        shape = shard.shape
        cut = slice(offset, offset + self.numel)
        self.master = group.torch_view(group.params)[cut].view(shape)
        self.grads = [group.torch_view(g)[cut].view(shape) for g in group.grads]
        self.copy = (group.torch_view(group.copy_out)[cut].view(shape)
                     if group.copy_out is not None else None)
        on_cpu = shard.device.type == "cpu" and not self.sharded
        self.grad_alias = on_cpu and self.grads[0].dtype == param.dtype
        self.alias = None  # the view .data is kept in, if any
        if alias_params and on_cpu:
            if param.dtype == torch.float32:
                self.alias = self.master
            elif self.copy is not None and param.dtype == self.copy.dtype:
                self.alias = self.copy
        self.version = None  # param._version after our last write; another means a user write

    def load_from_model(self):
        """Take the model's values as the master weights (and move .data into shared memory)."""
        p = self.param
        with torch.no_grad():
            if self.alias is not None and p.data_ptr() != self.alias.data_ptr():
                self.alias.copy_(p)
                p.data = self.alias
            if self.alias is not self.master:
                self.master.copy_(local(p))
        self.version = local(p)._version

    def refresh_if_changed(self):
        """A parameter the user wrote (load_state_dict, copy_) or re-seated (.data =) since our
        last write becomes the master again; an fp32 alias is the master itself."""
        p = self.param
        if local(p).shape != self.master.shape:
            raise ValueError(f"parameter {self.index} was {list(self.master.shape)} and is now "
                             f"{list(local(p).shape)}: an optimizer's parameters keep their "
                             "shape (make a new optimizer for a resized model)")
        moved = self.alias is not None and p.data_ptr() != self.alias.data_ptr()
        if moved or (self.alias is not self.master and local(p)._version != self.version):
            self.load_from_model()

    def stage_grad(self, k):
        """Put the gradient into buffer k; False if the parameter has none (then its slice is
        zeroed: the worker steps whole groups, and a zero slice keeps the global norm right)."""
        p, dst = self.param, self.grads[k]
        g = p.grad
        if g is None:
            dst.zero_()
            return False
        if g.is_sparse:
            raise RuntimeError("zenflow_bind.optim.AdamW does not support sparse gradients")
        if g.data_ptr() != dst.data_ptr():
            dst.copy_(local(g))
            if self.grad_alias:  # from now on backward accumulates in shared memory
                p.grad = dst
        return True

    def write_back(self):
        """Bring the updated parameters into the model when it does not alias them."""
        p = self.param
        if self.alias is None:
            # a copy-out exists only when the whole group has the parameter's 16-bit dtype
            src = self.copy if self.copy is not None else self.master
            with torch.no_grad():
                local(p).copy_(src)
        self.version = local(p)._version

    def detach(self):
        """Give the parameter and its gradient private memory again (before the worker goes)."""
        p = self.param
        if self.alias is not None and p.data_ptr() == self.alias.data_ptr():
            p.data = p.data.clone()
        if p.grad is not None and any(p.grad.data_ptr() == g.data_ptr() for g in self.grads):
            p.grad = p.grad.clone()


class Layout:
    """One torch param_group in one worker group."""

    def __init__(self, worker, params, hyper, alias_params, first_index=0):
        for p in params:
            if p.dtype not in DTYPE_NAMES:
                raise TypeError(f"zenflow_bind.optim.AdamW optimizes fp32, bf16 and fp16 "
                                f"parameters, not {p.dtype}")
        dtypes = {p.dtype for p in params}
        # One 16-bit dtype: gradients in it, and a copy-out in it for the model. Mixed dtypes in
        # one group: fp32 gradients, and each parameter converts from the fp32 master.
        grad = DTYPE_NAMES[dtypes.pop()] if len(dtypes) == 1 else "fp32"
        copy_out = grad if grad != "fp32" else None
        numel = sum(local(p).numel() for p in params)
        self.group = worker.add_group(numel, grad=grad, copy_out=copy_out, **hyper)
        self.slots, offset = [], 0
        for i, p in enumerate(params):
            self.slots.append(Slot(p, first_index + i, offset, self.group, alias_params))
            offset += self.slots[-1].numel
        for s in self.slots:
            s.load_from_model()

    @property
    def numel(self):
        return self.group.numel

    def flat_grads(self, k):
        return self.group.torch_view(self.group.grads[k])
