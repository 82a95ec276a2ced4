"""ctypes binding of libzenbind's optimizer worker API (zenbind/worker.h).

A Worker spawns zenflow-optimizer (pinned, NUMA-local Adam in another process); each parameter
group lives in shared memory and is exposed as numpy arrays (and torch tensors through
torch.from_numpy) that alias it, so filling a gradient buffer is one copy and reading the updated
parameters is none. Every libzenbind error raises ZenbindError with the status and message.

    with Worker(threads=2) as w:
        g = w.add_group(numel, grad="bf16", copy_out="bf16", lr=1e-3, weight_decay=0.01)
        g.params[:] = flat_params
        g.grads[0][:] = flat_grads            # buffer 0, while the worker may be busy with 1
        w.submit(step=1, grad_buffer=0)
        ...                                   # forward/backward of the next step
        w.wait(timeout_ms=10_000)

The library is found through $ZENFLOW_BIND_LIB, else the system's libzenbind.so.0.
"""

import ctypes
import ctypes.util
import os

import numpy as np

__all__ = ["ZenbindError", "Worker", "Group", "library"]

_STATUS = {0: "OK", -1: "EINVAL", -2: "ENOMEM", -3: "ESYS", -4: "ETOPOLOGY",
           -5: "EIMPOSSIBLE", -6: "ETIMEDOUT", -7: "EDEAD", -8: "EVERSION", -9: "EINTERNAL"}
_DTYPES = {None: 0, "none": 0, "fp32": 1, "bf16": 2, "fp16": 3}


class ZenbindError(RuntimeError):
    """A libzenbind call failed: .status is the zb_status name (e.g. "EDEAD"), .code its value."""

    def __init__(self, code, message):
        self.code = code
        self.status = _STATUS.get(code, str(code))
        super().__init__(f"{self.status}: {message}")


class _Attr(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char * 4096), ("cpus", ctypes.c_char * 1024),
                ("threads", ctypes.c_uint), ("mems", ctypes.c_char * 256),
                ("worker_spin_us", ctypes.c_uint), ("wait_spin_us", ctypes.c_uint),
                ("control_timeout_ms", ctypes.c_uint)]


class _Hyper(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float),
                ("adamw", ctypes.c_int), ("bias_correction", ctypes.c_int)]


class _GroupAttr(ctypes.Structure):
    _fields_ = [("numel", ctypes.c_size_t), ("grad", ctypes.c_int), ("copy_out", ctypes.c_int),
                ("stale", ctypes.c_int), ("hyper", _Hyper)]


class _Buffers(ctypes.Structure):
    _fields_ = [("numel", ctypes.c_size_t), ("params", ctypes.c_void_p),
                ("grads", ctypes.c_void_p * 2), ("copy_out", ctypes.c_void_p),
                ("stale", ctypes.c_void_p), ("grad", ctypes.c_int), ("copy", ctypes.c_int)]


class _Step(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("grad_scale", ctypes.c_float),
                ("grad_buffer", ctypes.c_uint), ("hypers", ctypes.POINTER(_Hyper)),
                ("nhypers", ctypes.c_size_t), ("flags", ctypes.c_uint),
                ("max_grad_norm", ctypes.c_float)]


class _Memory(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("numel", "params", "grads", "copy_out", "stale", "moments", "shm_reserved")] + \
               [("bytes_per_param", ctypes.c_double)] + \
               [(name, ctypes.c_size_t) for name in
                ("worker_rss", "worker_rss_anon", "worker_rss_shmem",
                 "trainer_rss", "trainer_rss_anon", "trainer_rss_shmem")]


_lib = None


def library():
    """The loaded libzenbind (ctypes.CDLL), with the worker API's prototypes."""
    global _lib
    if _lib is not None:
        return _lib
    path = os.environ.get("ZENFLOW_BIND_LIB") or ctypes.util.find_library("zenbind") \
        or "libzenbind.so.0"
    lib = ctypes.CDLL(path)
    P = ctypes.POINTER
    protos = {
        "zb_last_error": (ctypes.c_char_p, []),
        "zb_worker_attr_init": (None, [P(_Attr)]),
        "zb_worker_spawn": (ctypes.c_int, [P(_Attr), P(ctypes.c_void_p)]),
        "zb_worker_destroy": (ctypes.c_int, [ctypes.c_void_p]),
        "zb_adam_hyper_init": (None, [P(_Hyper)]),
        "zb_worker_group_add": (ctypes.c_int, [ctypes.c_void_p, P(_GroupAttr), P(ctypes.c_uint)]),
        "zb_worker_group_buffers": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, P(_Buffers)]),
        "zb_worker_submit": (ctypes.c_int, [ctypes.c_void_p, P(_Step)]),
        "zb_worker_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, P(ctypes.c_uint64)]),
        "zb_worker_memory_usage": (ctypes.c_int, [ctypes.c_void_p, P(_Memory)]),
        "zb_worker_pid": (ctypes.c_int, [ctypes.c_void_p, P(ctypes.c_int)]),
        "zb_worker_threads": (ctypes.c_int, [ctypes.c_void_p, P(ctypes.c_uint)]),
        "zb_worker_thread": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, P(ctypes.c_int),
                                            P(ctypes.c_int)]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = lib
    return lib


def _check(code):
    if code != 0:
        raise ZenbindError(code, library().zb_last_error().decode(errors="replace"))


def _hyper(lr, betas, eps, weight_decay, adamw, bias_correction=True):
    return _Hyper(lr, betas[0], betas[1], eps, weight_decay, int(adamw), int(bias_correction))


def _array(address, dtype, count, owner):
    """A numpy array over shared memory (no copy); bf16 has no numpy type and shows as int16.
    The array keeps `owner` (the Worker) alive through its base buffer, so the memory stays
    mapped as long as any view of it exists, until an explicit close()."""
    np_type = {"fp32": np.float32, "fp16": np.float16, "bf16": np.int16}[dtype]
    size = count * np.dtype(np_type).itemsize
    buf = (ctypes.c_char * size).from_address(address)
    buf._owner = owner
    return np.frombuffer(buf, dtype=np_type, count=count)


_NAMES = {1: "fp32", 2: "bf16", 3: "fp16"}


class Group:
    """One registered parameter group: numpy views of its shared buffers.

    params (fp32), grads[0] and grads[1] (the group's gradient dtype), copy_out (bf16/fp16 or
    None) and stale (fp32 or None). bf16 arrays are int16 in numpy: use torch_view() for a
    torch.bfloat16 tensor over the same memory."""

    def __init__(self, worker, index, hyper):
        self.worker = worker
        self.index = index
        self.hyper = hyper
        b = _Buffers()
        _check(library().zb_worker_group_buffers(worker._handle, index, ctypes.byref(b)))
        self.numel = b.numel
        self.grad_dtype = _NAMES[b.grad]
        self.copy_dtype = _NAMES.get(b.copy)
        self.params = _array(b.params, "fp32", b.numel, worker)
        self.grads = [_array(b.grads[k], self.grad_dtype, b.numel, worker) for k in (0, 1)]
        self.copy_out = (_array(b.copy_out, self.copy_dtype, b.numel, worker)
                         if b.copy_out else None)
        self.stale = _array(b.stale, "fp32", b.numel, worker) if b.stale else None

    @staticmethod
    def torch_view(array):
        """A torch tensor sharing `array`'s memory (int16 arrays become torch.bfloat16)."""
        import torch
        t = torch.from_numpy(array)
        return t.view(torch.bfloat16) if array.dtype == np.int16 else t

    def set_hyper(self, lr=None, betas=None, eps=None, weight_decay=None, adamw=None):
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


class Worker:
    """A zenflow-optimizer worker. Arguments left None take libzenbind's defaults: the
    ZENFLOW_OPT_CPUS / ZENFLOW_OPT_THREADS / ZENFLOW_OPT_MEMS variables, else the caller's CPUs."""

    def __init__(self, cpus=None, threads=None, mems=None, path=None, worker_spin_us=None,
                 wait_spin_us=None, control_timeout_ms=None):
        lib = library()
        attr = _Attr()
        lib.zb_worker_attr_init(ctypes.byref(attr))
        if path is not None:
            attr.path = os.fsencode(path)
        if cpus is not None:
            attr.cpus = cpus.encode()
        if mems is not None:
            attr.mems = mems.encode()
        if threads is not None:
            attr.threads = threads
        if worker_spin_us is not None:
            attr.worker_spin_us = worker_spin_us
        if wait_spin_us is not None:
            attr.wait_spin_us = wait_spin_us
        if control_timeout_ms is not None:
            attr.control_timeout_ms = control_timeout_ms
        handle = ctypes.c_void_p()
        _check(lib.zb_worker_spawn(ctypes.byref(attr), ctypes.byref(handle)))
        self._handle = handle
        self._owner = os.getpid()
        self.groups = []

    def add_group(self, numel, grad="fp32", copy_out=None, stale=False, lr=1e-3,
                  betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, adamw=True):
        """Register a group of `numel` parameters (zeroed: fill .params before the first step)."""
        if grad not in ("fp32", "bf16", "fp16") or copy_out not in (None, "bf16", "fp16"):
            raise ValueError("grad must be fp32, bf16 or fp16; copy_out None, bf16 or fp16")
        attr = _GroupAttr(numel, _DTYPES[grad], _DTYPES[copy_out], int(stale),
                          _hyper(lr, betas, eps, weight_decay, adamw))
        index = ctypes.c_uint()
        _check(library().zb_worker_group_add(self._live(), ctypes.byref(attr),
                                             ctypes.byref(index)))
        group = Group(self, index.value, attr.hyper)
        self.groups.append(group)
        return group

    def submit(self, step, grad_buffer=0, grad_scale=1.0):
        """Start step `step` (1-based) on gradient buffer 0 or 1, with each group's current
        hyperparameters; returns at once."""
        hypers = (_Hyper * len(self.groups))(*[g.hyper for g in self.groups])
        s = _Step(step, grad_scale, grad_buffer, hypers if self.groups else None, len(self.groups))
        _check(library().zb_worker_submit(self._live(), ctypes.byref(s)))

    def wait(self, timeout_ms=60_000):
        """Wait for the step in flight; returns the count of non-finite gradient elements."""
        nonfinite = ctypes.c_uint64()
        _check(library().zb_worker_wait(self._live(), timeout_ms, ctypes.byref(nonfinite)))
        return nonfinite.value

    def step(self, step, grad_buffer=0, grad_scale=1.0, timeout_ms=60_000):
        self.submit(step, grad_buffer, grad_scale)
        return self.wait(timeout_ms)

    def memory(self):
        """Bytes by buffer kind and RSS of both processes (zb_worker_memory) as a dict."""
        m = _Memory()
        _check(library().zb_worker_memory_usage(self._live(), ctypes.byref(m)))
        return {name: getattr(m, name) for name, _ in _Memory._fields_}

    @property
    def pid(self):
        pid = ctypes.c_int()
        _check(library().zb_worker_pid(self._live(), ctypes.byref(pid)))
        return pid.value

    def threads(self):
        """[(tid, cpu)] of the worker's pinned threads."""
        lib = library()
        count = ctypes.c_uint()
        _check(lib.zb_worker_threads(self._live(), ctypes.byref(count)))
        out = []
        for i in range(count.value):
            tid, cpu = ctypes.c_int(), ctypes.c_int()
            _check(lib.zb_worker_thread(self._handle, i, ctypes.byref(tid), ctypes.byref(cpu)))
            out.append((tid.value, cpu.value))
        return out

    def close(self):
        """Stop the worker. The numpy views of its groups must not be used afterwards."""
        if self._handle:
            handle, self._handle = self._handle, None
            self.groups = []
            if os.getpid() == self._owner:  # a forked child's copy just forgets the handle
                _check(library().zb_worker_destroy(handle))

    def _live(self):
        if not self._handle:
            raise ZenbindError(-1, "the worker was closed")
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
