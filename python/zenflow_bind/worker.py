"""Worker and Group: a zenflow-optimizer process and its parameter groups, whose shared buffers
are numpy arrays (torch tensors through Group.torch_view) aliasing the shared memory."""

import collections
import collections.abc
import ctypes
import numbers
import os

import numpy as np

from . import _native
from ._native import ZenbindError, check, library
from ._signals import deferred_interrupts

StepResult = collections.namedtuple("StepResult", "nonfinite grad_norm skipped seconds")
StepResult.__doc__ = """What the worker reports for a step: non-finite gradient elements after
scaling, the global L2 norm of the scaled gradients (when asked for), whether the step was skipped
(nothing written) and the worker's own time for it in seconds."""


class Group:
    """One registered parameter group: numpy views of its shared buffers.

    params (fp32), grads (the group's gradient dtype: buffers 0 and 1, or 0 alone), copy_out
    (bf16/fp16 or None) and stale (fp32 or None). bf16 arrays are int16 in numpy: use
    torch_view() for a torch.bfloat16 tensor over the same memory."""

    def __init__(self, worker, index, hyper):
        self.worker = worker
        self.index = index
        self.hyper = hyper
        b = _native.Buffers()
        check(library().zb_worker_group_buffers(worker._handle, index, ctypes.byref(b)))
        self.numel = b.numel
        self.grad_dtype = _native.DTYPE_NAMES[b.grad]
        self.copy_dtype = _native.DTYPE_NAMES.get(b.copy)
        self.params = _native.array(b.params, "fp32", b.numel, worker.mapping)
        self.grads = [_native.array(b.grads[k], self.grad_dtype, b.numel, worker.mapping)
                      for k in (0, 1) if b.grads[k]]
        self.copy_out = (_native.array(b.copy_out, self.copy_dtype, b.numel, worker.mapping)
                         if b.copy_out else None)
        self.stale = _native.array(b.stale, "fp32", b.numel, worker.mapping) if b.stale \
            else None

    @staticmethod
    def torch_view(array):
        """A torch tensor sharing `array`'s memory (int16 arrays become torch.bfloat16)."""
        import torch
        t = torch.from_numpy(array)
        return t.view(torch.bfloat16) if array.dtype == np.int16 else t

    def set_hyper(self, lr=None, betas=None, eps=None, weight_decay=None, adamw=None,
                  bias_correction=None):
        """Change this group's hyperparameters for the following steps."""
        h = self.hyper
        if lr is not None:
            h.lr = lr
        if betas is not None:
            h.beta1, h.beta2 = betas
        if eps is not None:
            h.eps = eps
        if weight_decay is not None:
            h.weight_decay = weight_decay
        if adamw is not None:
            h.adamw = int(adamw)
        if bias_correction is not None:
            h.bias_correction = int(bias_correction)

    def get_state(self, exp_avg=None, exp_avg_sq=None):
        """Copy the Adam moments into the given float32 arrays (numel each; None skips one) and
        return the group's step count (steps applied). Between steps only."""
        step = ctypes.c_int64()
        check(library().zb_worker_group_get_state(
            self.worker._live(), self.index, _address(exp_avg, self.numel),
            _address(exp_avg_sq, self.numel), ctypes.byref(step)))
        return step.value

    def take_state(self, count=True):
        """(exp_avg, exp_avg_sq, step): the Adam moments as float32 arrays in memory of their own,
        copied once out of the worker (nothing is copied into the caller's), kept while any view
        of them lives; writes to them stay here (set_state gives the worker new ones), a
        later step leaves them as they are. Between steps only. count=False: step is None, and
        no round trip to the worker is made for it where its memory is read straight."""
        lib, handle = library(), ctypes.c_void_p()
        m, v, step = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int64()
        with deferred_interrupts():  # an interrupt between the two would leak the memory
            check(lib.zb_worker_group_take_state(self.worker._live(), self.index,
                                                 ctypes.byref(handle), ctypes.byref(m),
                                                 ctypes.byref(v),
                                                 ctypes.byref(step) if count else None))
            owner = _native.Owner(lib.zb_worker_state_release, handle.value)
        return (_native.array(m.value, "fp32", self.numel, owner),
                _native.array(v.value, "fp32", self.numel, owner), step.value if count else None)

    def set_state(self, exp_avg, exp_avg_sq, step):
        """Replace the moments (None: zeros) and the step count (>= 0). Between steps only."""
        check(library().zb_worker_group_set_state(
            self.worker._live(), self.index, _address(exp_avg, self.numel),
            _address(exp_avg_sq, self.numel), step))

    def load_state(self, ranges, step):
        """set_state from where the moments are, with no gathering first: ranges (offset,
        numel, exp_avg, exp_avg_sq) of the group, sorted and disjoint, each moment numel
        elements as set_state takes them (None: zeros); zeros around them. Between steps only."""
        table = (_native.StateRange * max(len(ranges), 1))(
            *[_native.StateRange(o, n, _address(m, n), _address(v, n)) for o, n, m, v in ranges])
        check(library().zb_worker_group_load_state(self.worker._live(), self.index, table,
                                                   len(ranges), step))

    def set_ranges(self, ranges):
        """Ranges (offset, numel, lag, idle) of the group that step differently: `lag` (> 0)
        steps behind the group, stepped with their own step number (bias correction), or idle
        (left alone by steps). Sorted and disjoint; replaces the previous ones ([] clears them)
        and holds across steps. Between steps only."""
        table = (_native.StepRange * max(len(ranges), 1))(
            *[_native.StepRange(o, n, lag, int(idle), 0) for o, n, lag, idle in ranges])
        check(library().zb_worker_group_set_ranges(self.worker._live(), self.index, table,
                                                   len(ranges)))

    def remove(self):
        """Undo this group's registration; groups go newest first. Its memory leaves both
        processes: its arrays are dropped here, and no view of them may be used again."""
        if self.worker.groups[-1:] != [self]:
            raise ValueError(f"group {self.index} is not the newest: groups go newest first")
        check(library().zb_worker_group_remove(self.worker._live(), self.index))
        self.worker.groups.pop()
        self.params, self.grads, self.copy_out, self.stale = None, [], None, None


def _address(array, numel):
    """The address of a C-contiguous float32 array of numel elements: a numpy array or a CPU
    torch tensor (duck-typed, so this module needs no torch)."""
    if array is None:
        return None
    if hasattr(array, "data_ptr"):  # torch.Tensor
        ok = str(array.dtype) == "torch.float32" and array.is_contiguous() and \
            array.device.type == "cpu" and array.numel() == numel
        address = array.data_ptr()
    else:
        ok = array.dtype == np.float32 and array.flags.c_contiguous and array.size == numel
        address = array.ctypes.data
    if not ok:
        raise ValueError(f"state arrays must be contiguous float32 of {numel} elements on the CPU")
    return address


class Mapping:
    """The trainer's side of a worker's shared memory (its zb_worker_t handle): freed by
    zb_worker_destroy() when the last numpy view of any of the buffers goes, which may be after
    the worker itself was stopped (Worker.close()). A gradient the user kept after close() (p.grad
    was a view of the buffer) stays readable so. The only object that frees or stops the handle:
    a collected cycle may finalise it before its Worker."""

    def __init__(self, handle):
        self._handle = handle
        self._owner = os.getpid()

    def stop(self):
        """End the worker process (zb_worker_stop), keeping the buffers; a no-op once freed,
        and in a forked child (only its copies are the child's)."""
        if self._handle and os.getpid() == self._owner:
            check(library().zb_worker_stop(self._handle))

    def __del__(self):
        handle, self._handle = self._handle, None
        if handle:
            library().zb_worker_destroy(handle)


def _cpu_list(value, name):
    """cpus/mems as libzenbind takes them: a Linux cpu list ("4-7,12"), from that text or from
    ints (one, or any iterable of them: os.sched_getaffinity(0), a range, a list)."""
    if value is None or isinstance(value, str):
        return value.encode() if value is not None else None
    if isinstance(value, numbers.Integral):
        items = [value]
    # (bytes are ints one by one: b"0-3" would be CPUs 45, 48 and 51)
    elif isinstance(value, collections.abc.Iterable) and \
            not isinstance(value, (bytes, bytearray, memoryview)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be a cpu list such as '4-7,12' or ints, not "
                        f"{type(value).__name__}")
    if not items or any(isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0
                        for i in items):
        raise ValueError(f"{name} must be a cpu list such as '4-7,12' or non-negative ints, "
                         f"not {value!r}")
    return ",".join(map(str, sorted({int(i) for i in items}))).encode()


class Worker:
    """A zenflow-optimizer worker. Arguments left None take libzenbind's defaults: the
    ZENFLOW_OPT_CPUS / ZENFLOW_OPT_THREADS / ZENFLOW_OPT_MEMS variables, else the caller's CPUs."""

    def __init__(self, cpus=None, threads=None, mems=None, path=None, worker_spin_us=None,
                 wait_spin_us=None, control_timeout_ms=None):
        lib = library()
        attr = _native.Attr()
        lib.zb_worker_attr_init_size(ctypes.byref(attr), ctypes.sizeof(attr))
        # attr points into these bytes: they live until zb_worker_spawn has returned
        path = _native.optimizer_path(path)
        path = os.fsencode(path) if path is not None else None
        cpus, mems = _cpu_list(cpus, "cpus"), _cpu_list(mems, "mems")
        given = {"path": path, "cpus": cpus, "mems": mems, "threads": threads,
                 "worker_spin_us": worker_spin_us, "wait_spin_us": wait_spin_us,
                 "control_timeout_ms": control_timeout_ms}
        for name, value in given.items():
            if value is not None:  # None keeps zb_worker_attr_init's default
                setattr(attr, name, value)
        handle = ctypes.c_void_p()
        check(lib.zb_worker_spawn(ctypes.byref(attr), 0, ctypes.byref(handle)))
        self._handle = handle
        self.mapping = Mapping(handle)
        self._owner = os.getpid()
        self.groups = []
        self._last_seconds = 0.0

    def add_group(self, numel, grad="fp32", copy_out=None, stale=False, lr=1e-3,
                  betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, adamw=True,
                  bias_correction=True, grad_buffers=2):
        """Register a group of `numel` parameters (zeroed: fill .params before the first step).
        grad_buffers=1 saves one gradient buffer where no step overlaps the next backward."""
        if grad not in ("fp32", "bf16", "fp16") or copy_out not in (None, "bf16", "fp16"):
            raise ValueError("grad must be fp32, bf16 or fp16; copy_out None, bf16 or fp16")
        if grad_buffers not in (1, 2):
            raise ValueError(f"grad_buffers must be 1 or 2, not {grad_buffers!r}")
        flags = (_native.GROUP_STALE if stale else 0) | \
            (_native.GROUP_ONE_GRAD_BUFFER if grad_buffers == 1 else 0)
        attr = _native.GroupAttr(numel, _native.DTYPES[grad], _native.DTYPES[copy_out], flags,
                                 _native.hyper(lr, betas, eps, weight_decay, adamw,
                                               bias_correction))
        index = ctypes.c_uint()
        check(library().zb_worker_group_add(self._live(), ctypes.byref(attr),
                                            ctypes.byref(index)))
        group = Group(self, index.value, attr.hyper)
        self.groups.append(group)
        return group

    def submit(self, step, grad_buffer=0, grad_scale=1.0, flags=0, max_grad_norm=0.0,
               groups=None):
        """Start a step on gradient buffer 0 or 1 with each group's current hyperparameters;
        returns at once. step >= 1 is every group's step number; 0 lets each group count its
        own. flags: STEP_SKIP_NONFINITE, STEP_GRAD_NORM; max_grad_norm > 0 clips by the global
        norm. groups: a range of group indices to step alone (a bucket), else every group."""
        every = groups is None
        groups = range(len(self.groups)) if every else groups
        if not every and (groups.step != 1 or not groups):
            raise ValueError("groups is a non-empty range of consecutive group indices")
        if not every and (groups.start < 0 or groups.stop > len(self.groups)):
            raise ValueError(f"groups {groups.start} to {groups.stop} (exclusive) are not "
                             f"registered ({len(self.groups)} are)")
        chosen = [self.groups[i].hyper for i in groups]
        hypers = (_native.Hyper * len(chosen))(*chosen)
        s = _native.Step(step, grad_scale, grad_buffer, hypers if chosen else None,
                         len(chosen), flags, max_grad_norm)
        if every:
            check(library().zb_worker_submit(self._live(), ctypes.byref(s)))
        else:
            check(library().zb_worker_submit_groups(
                self._live(), ctypes.byref(s), groups.start, len(groups)))

    def wait(self, timeout_ms=60_000):
        """Wait for the step in flight; returns the count of non-finite gradient elements."""
        return self.wait_result(timeout_ms).nonfinite

    def wait_result(self, timeout_ms=60_000):
        """Wait for the step in flight; returns its StepResult."""
        r = _native.Result()
        check(library().zb_worker_wait_result(self._live(), timeout_ms, ctypes.byref(r)))
        self._last_seconds = r.seconds
        return StepResult(r.nonfinite, r.grad_norm, bool(r.skipped), r.seconds)

    def step(self, step, grad_buffer=0, grad_scale=1.0, timeout_ms=60_000):
        self.submit(step, grad_buffer, grad_scale)
        return self.wait(timeout_ms)

    def last_step_seconds(self):
        """The worker's own time for the last step waited for, in seconds (0 before the first
        step, and for a step with no group): the seconds of its StepResult."""
        self._live()
        return self._last_seconds

    def memory(self):
        """Bytes by buffer kind and RSS of both processes (zb_worker_memory) as a dict."""
        m = _native.Memory()
        check(library().zb_worker_memory_usage(self._live(), ctypes.byref(m)))
        return {name: getattr(m, name) for name, _ in _native.Memory._fields_}

    @property
    def pid(self):
        pid = ctypes.c_int()
        check(library().zb_worker_pid(self._live(), ctypes.byref(pid)))
        return pid.value

    def dead(self):
        """Whether the worker process has ended (killed, crashed) while this handle is open: its
        state is gone. False while it runs, or is stopped (SIGSTOP, a suspended job), and where
        this cannot tell (another process now holds its pid, reaped: taken as alive)."""
        if not self._handle or self.forked:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True

    def threads(self):
        """[(tid, cpu)] of the worker's pinned threads."""
        lib = library()
        count = ctypes.c_uint()
        check(lib.zb_worker_threads(self._live(), ctypes.byref(count)))
        out = []
        for i in range(count.value):
            tid, cpu = ctypes.c_int(), ctypes.c_int()
            check(lib.zb_worker_thread(self._handle, i, ctypes.byref(tid), ctypes.byref(cpu)))
            out.append((tid.value, cpu.value))
        return out

    @property
    def closed(self):
        return not self._handle

    @property
    def forked(self):
        """Whether this is a forked child's copy of the handle (the worker is the parent's)."""
        return os.getpid() != self._owner

    def close(self):
        """Stop the worker. The views of its groups' buffers stay readable, with their last
        values, as long as any exists: the memory goes with the last (Mapping). In a forked
        child only the child's copies go (libzenbind leaves the worker alone)."""
        if self._handle:
            self._handle = None
            self.groups = []
            try:
                self.mapping.stop()
            finally:
                self.mapping = None  # unmapped now, unless a view of the buffers lives on

    def _live(self):
        if not self._handle:
            raise ZenbindError(-1, "the worker was closed")
        if self.forked:
            raise ZenbindError(-1, f"this worker belongs to process {self._owner}; a forked "
                                   "child cannot use it")
        return self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
