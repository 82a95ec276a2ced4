"""libzenbind through ctypes: where the library and the worker executable are found, the mirrors
of zenbind/worker.h's and zenbind/adam.h's structures, and errors as ZenbindError.

Only this module knows the C ABI; worker.py builds the Python objects on it."""

import ctypes
import os
import weakref

import numpy as np

STATUS = {0: "OK", -1: "EINVAL", -2: "ENOMEM", -3: "ESYS", -4: "ETOPOLOGY",
          -5: "EIMPOSSIBLE", -6: "ETIMEDOUT", -7: "EDEAD", -8: "EVERSION", -9: "EINTERNAL",
          -10: "ENOENT"}
DTYPES = {None: 0, "none": 0, "fp32": 1, "bf16": 2, "fp16": 3}
DTYPE_NAMES = {code: name for name, code in DTYPES.items() if name and code}

STEP_SKIP_NONFINITE = 0x1  # ZB_STEP_SKIP_NONFINITE
STEP_GRAD_NORM = 0x2       # ZB_STEP_GRAD_NORM
GROUP_STALE = 0x1          # ZB_GROUP_STALE
GROUP_ONE_GRAD_BUFFER = 0x2  # ZB_GROUP_ONE_GRAD_BUFFER
MAX_GROUPS = 4096          # ZB_WORKER_MAX_GROUPS
ADAM_MAX_THREADS = 1024    # ZB_ADAM_MAX_THREADS
API_VERSION = 2            # ZB_API_VERSION: the ABI this module mirrors, libzenbind.so.2


class ZenbindError(RuntimeError):
    """A libzenbind call failed: .status is the zb_status name (e.g. "EDEAD"), .code its value."""

    def __init__(self, code, message):
        self.code = code
        self.status = STATUS.get(code, str(code))
        super().__init__(f"{self.status}: {message}")


class Attr(ctypes.Structure):
    """zb_worker_attr. Fill it with zb_worker_attr_init_size(attr, ctypes.sizeof(attr)); path,
    cpus and mems point to bytes the caller keeps alive until zb_worker_spawn returns."""
    _fields_ = [("size", ctypes.c_size_t), ("path", ctypes.c_char_p), ("cpus", ctypes.c_char_p),
                ("threads", ctypes.c_uint), ("mems", ctypes.c_char_p),
                ("worker_spin_us", ctypes.c_uint), ("wait_spin_us", ctypes.c_uint),
                ("control_timeout_ms", ctypes.c_uint)]


class Hyper(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float),
                ("adamw", ctypes.c_int), ("bias_correction", ctypes.c_int)]


class GroupAttr(ctypes.Structure):
    _fields_ = [("numel", ctypes.c_size_t), ("grad", ctypes.c_int), ("copy_out", ctypes.c_int),
                ("flags", ctypes.c_uint), ("hyper", Hyper)]


class Buffers(ctypes.Structure):
    _fields_ = [("numel", ctypes.c_size_t), ("params", ctypes.c_void_p),
                ("grads", ctypes.c_void_p * 2), ("copy_out", ctypes.c_void_p),
                ("stale", ctypes.c_void_p), ("grad", ctypes.c_int), ("copy", ctypes.c_int)]


class StepRange(ctypes.Structure):
    """zb_step_range: elements [offset, offset + numel) of a group are `lag` steps behind it, or
    idle (left alone by steps)."""
    _fields_ = [("offset", ctypes.c_uint64), ("numel", ctypes.c_uint64), ("lag", ctypes.c_int64),
                ("idle", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class StateRange(ctypes.Structure):
    """zb_state_range: elements [offset, offset + numel) of a group and where their moments are
    read from (None: zeros)."""
    _fields_ = [("offset", ctypes.c_size_t), ("numel", ctypes.c_size_t),
                ("exp_avg", ctypes.c_void_p), ("exp_avg_sq", ctypes.c_void_p)]


class Step(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("grad_scale", ctypes.c_float),
                ("grad_buffer", ctypes.c_uint), ("hypers", ctypes.POINTER(Hyper)),
                ("nhypers", ctypes.c_size_t), ("flags", ctypes.c_uint),
                ("max_grad_norm", ctypes.c_float)]


class Result(ctypes.Structure):
    _fields_ = [("nonfinite", ctypes.c_uint64), ("grad_norm", ctypes.c_double),
                ("skipped", ctypes.c_int), ("seconds", ctypes.c_double)]


class AdamTensor(ctypes.Structure):
    _fields_ = [("param", ctypes.c_void_p), ("grad", ctypes.c_void_p),
                ("exp_avg", ctypes.c_void_p), ("exp_avg_sq", ctypes.c_void_p),
                ("copy_out", ctypes.c_void_p), ("numel", ctypes.c_size_t),
                ("hyper", ctypes.POINTER(Hyper)), ("step", ctypes.c_int64)]


class AdamArgs(ctypes.Structure):
    """zb_adam_args. Fill it with zb_adam_args_init_size(args, ctypes.sizeof(args))."""
    _fields_ = [("size", ctypes.c_size_t), ("grad", ctypes.c_int), ("copy_out", ctypes.c_int),
                ("hyper", Hyper), ("step", ctypes.c_int64), ("grad_scale", ctypes.c_float),
                ("flags", ctypes.c_uint), ("max_grad_norm", ctypes.c_float),
                ("threads", ctypes.c_int)]


class GradStats(ctypes.Structure):
    _fields_ = [("sum_squares", ctypes.c_double), ("nonfinite", ctypes.c_uint64)]


class Memory(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("numel", "params", "grads", "copy_out", "stale", "moments", "shm_reserved")] + \
               [("bytes_per_param", ctypes.c_double)] + \
               [(name, ctypes.c_size_t) for name in
                ("worker_rss", "worker_rss_anon", "worker_rss_shmem",
                 "trainer_rss", "trainer_rss_anon", "trainer_rss_shmem")]


# A wheel built by `pip install ./python` carries both native parts here
# (python/_build/backend.py); the Debian and RPM packages install them system-wide.
_BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")
SONAME = f"libzenbind.so.{API_VERSION}"


def library_path():
    """Where libzenbind is loaded from: $ZENFLOW_BIND_LIB, else the one pip bundled with this
    package, else the system's libzenbind.so.2 (the ABI this module mirrors: not whatever
    libzenbind.so points to, which only the -dev package installs)."""
    bundled = os.path.join(_BUNDLED, SONAME)
    return os.environ.get("ZENFLOW_BIND_LIB") or \
        (bundled if os.path.exists(bundled) else None) or SONAME


def optimizer_path(path=None):
    """The zenflow-optimizer executable to spawn: `path`, else $ZENFLOW_OPTIMIZER, else the one
    pip bundled with this package; None leaves the choice to libzenbind (its installed libexec
    path)."""
    bundled = os.path.join(_BUNDLED, "zenflow-optimizer")
    return path or os.environ.get("ZENFLOW_OPTIMIZER") or \
        (bundled if os.access(bundled, os.X_OK) else None)


_P = ctypes.POINTER
_PROTOS = {
    "zb_last_error": (ctypes.c_char_p, []),
    "zb_version": (ctypes.c_char_p, []),
    "zb_worker_attr_init_size": (None, [_P(Attr), ctypes.c_size_t]),
    "zb_worker_spawn": (ctypes.c_int, [_P(Attr), ctypes.c_ulong, _P(ctypes.c_void_p)]),
    "zb_worker_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "zb_adam_hyper_init": (None, [_P(Hyper)]),
    "zb_adam_hyper_check": (ctypes.c_int, [_P(Hyper)]),
    "zb_worker_group_add": (ctypes.c_int, [ctypes.c_void_p, _P(GroupAttr), _P(ctypes.c_uint)]),
    "zb_worker_group_buffers": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, _P(Buffers)]),
    "zb_worker_submit": (ctypes.c_int, [ctypes.c_void_p, _P(Step)]),
    "zb_worker_submit_groups": (ctypes.c_int, [ctypes.c_void_p, _P(Step), ctypes.c_uint,
                                               ctypes.c_uint]),
    "zb_worker_memory_usage": (ctypes.c_int, [ctypes.c_void_p, _P(Memory)]),
    "zb_worker_pid": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int)]),
    "zb_worker_threads": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_uint)]),
    "zb_worker_thread": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, _P(ctypes.c_int),
                                        _P(ctypes.c_int)]),
    "zb_worker_wait_result": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, _P(Result)]),
    "zb_worker_group_get_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                                 ctypes.c_void_p, _P(ctypes.c_int64)]),
    "zb_worker_group_take_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint,
                                                  _P(ctypes.c_void_p), _P(ctypes.c_void_p),
                                                  _P(ctypes.c_void_p), _P(ctypes.c_int64)]),
    "zb_worker_state_release": (None, [ctypes.c_void_p]),
    "zb_worker_group_set_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                                 ctypes.c_void_p, ctypes.c_int64]),
    "zb_worker_group_load_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint,
                                                  _P(StateRange), ctypes.c_size_t,
                                                  ctypes.c_int64]),
    "zb_worker_group_set_ranges": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint,
                                                  _P(StepRange), ctypes.c_size_t]),
    "zb_worker_group_remove": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint]),
    "zb_worker_stop": (ctypes.c_int, [ctypes.c_void_p]),
    "zb_adam_args_init_size": (None, [_P(AdamArgs), ctypes.c_size_t]),
    "zb_adam_step": (ctypes.c_int, [_P(AdamTensor), ctypes.c_size_t, _P(AdamArgs), _P(Result)]),
    "zb_adam_grad_stats": (ctypes.c_int, [_P(AdamTensor), ctypes.c_size_t, _P(AdamArgs),
                                          _P(GradStats)]),
}

_lib = None


# The C structs mirrored above, by their names in zenbind/worker.h.
_MIRRORS = {"zb_worker_attr": Attr, "zb_adam_hyper": Hyper, "zb_group_attr": GroupAttr,
            "zb_group_buffers": Buffers, "zb_worker_step": Step, "zb_worker_result": Result,
            "zb_worker_memory": Memory, "zb_adam_tensor": AdamTensor, "zb_adam_args": AdamArgs,
            "zb_step_range": StepRange, "zb_grad_stats": GradStats}


def _check_api(lib, path):
    """Refuse a library of another ABI than the one mirrored here (zb_api_version() is the N of
    libzenbind.so.N; before libzenbind.so.2 it returned the package's version number)."""
    api = getattr(lib, "zb_api_version", None)
    if api is None:
        raise ZenbindError(-8, f"{path} has no zb_api_version(): it is not libzenbind; install "
                               f"{SONAME}")
    api.restype, api.argtypes = ctypes.c_uint, []
    version = api()
    if version != API_VERSION:
        found = f"of ABI {version}" if version < 0x100 else \
            f"{version >> 16}.{(version >> 8) & 0xff}.{version & 0xff}, of an ABI before 2"
        raise ZenbindError(-8, f"{path} is libzenbind {found}; this binding needs ABI "
                               f"{API_VERSION} ({SONAME}): install matching versions of "
                               "libzenbind and the zenflow_bind package")


def _check_layouts(lib, path):
    """Refuse a library whose structs are not the ones mirrored here: passing a struct of the
    wrong size would corrupt memory instead of failing."""
    size = getattr(lib, "zb_struct_size", None)
    if size is None:
        raise ZenbindError(-8, f"{path} has no zb_struct_size(): it is older than this binding; "
                               "install the matching libzenbind")
    size.restype, size.argtypes = ctypes.c_size_t, [ctypes.c_char_p]
    for name, mirror in _MIRRORS.items():
        if size(name.encode()) != ctypes.sizeof(mirror):
            raise ZenbindError(-8, f"{path}: struct {name} is {size(name.encode())} bytes, this "
                                   f"binding's mirror {ctypes.sizeof(mirror)}: install matching "
                                   "versions of libzenbind and the zenflow_bind package")


def library():
    """The loaded libzenbind (ctypes.CDLL), with the worker API's prototypes, after checking that
    it is the ABI (zb_api_version) and has the struct layouts this module mirrors. Every call in
    _PROTOS is in that ABI, so each is an attribute of the result."""
    global _lib
    if _lib is None:
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(f"{e}: zenflow_bind needs libzenbind ({SONAME}): install the "
                          f"libzenbind{API_VERSION} package, or `pip install ./python` (which "
                          "bundles it), or set ZENFLOW_BIND_LIB to a built one "
                          f"(build/default/libzenbind/{SONAME})") from e
        _check_api(lib, path)
        _check_layouts(lib, path)
        for name, (restype, argtypes) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = lib
    return _lib


def check(code):
    if code != 0:
        raise ZenbindError(code, library().zb_last_error().decode(errors="replace"))


def hyper(lr, betas, eps, weight_decay, adamw, bias_correction=True):
    return Hyper(lr, betas[0], betas[1], eps, weight_decay, int(adamw), int(bias_correction))


# What torch.optim calls the field that zb_adam_hyper_check's message begins with.
_TORCH_NAMES = {"lr": "learning rate (lr)", "beta1": "betas", "eps": "eps",
                "weight_decay": "weight_decay", "adamw": "adamw_mode or bias_correction"}


def check_hyper(h):
    """ValueError unless libzenbind accepts the Hyper h: the ranges have one definition, there."""
    if library().zb_adam_hyper_check(ctypes.byref(h)) != 0:
        rule = library().zb_last_error().decode(errors="replace").split(": ", 1)[-1]
        raise ValueError(f"invalid {_TORCH_NAMES.get(rule.split()[0], 'hyperparameter')}: {rule}")


class Owner:
    """Calls release(handle) once nothing refers to it any more: the owner of memory that
    libzenbind handed out (arrays keep it alive). Not at exit: the process ends anyway, and a
    reader late in the exit would find the memory gone."""

    def __init__(self, release, handle):
        weakref.finalize(self, release, handle).atexit = False


def array(address, dtype, count, owner):
    """A numpy array over shared memory (no copy); bf16 has no numpy type and shows as int16.
    The array keeps `owner` (the worker's mapping, worker.Mapping) alive through its base
    buffer, so the memory stays mapped as long as any view of it exists."""
    np_type = {"fp32": np.float32, "fp16": np.float16, "bf16": np.int16}[dtype]
    size = count * np.dtype(np_type).itemsize
    buf = (ctypes.c_char * size).from_address(address)
    buf._owner = owner
    return np.frombuffer(buf, dtype=np_type, count=count)
