"""zenflow_bind.functional: the optimizer's Adam/AdamW step on the caller's own tensors, in this
process, in the style of torch.optim's functional forms.

    from zenflow_bind.functional import adamw_
    adamw_(params, grads, exp_avgs, exp_avg_sqs, step=t, lr=1e-3, weight_decay=0.01)

One fused pass over every tensor (libzenbind's zb_adam_step: AVX-512 or AVX2 on x86-64, SVE or
NEON on aarch64, as the CPU allows, the same bits on every path, architecture and thread count
(but for the sign of a NaN an operation makes, which differs between x86-64 and Arm), and the
same as a zenflow_bind.optim.AdamW step with the same arguments), on `threads` OpenMP
threads of this process. For an optimizer that steps where training runs: srun
--zenflow-bind=mode=offload, FSDP2's CPUOffloadPolicy. Unlike torch's functional adamw, `step`
is this step's number (from 1), read and never incremented, and betas is a pair. See
zenflow_bind.optim(3)."""

import array
import ctypes
import numbers

import torch

from . import _native
from ._compile import eager
from ._layout import DTYPE_NAMES
from ._native import STEP_GRAD_NORM, STEP_SKIP_NONFINITE
from .worker import StepResult

__all__ = ["adamw_", "StepResult"]


def _version_bumper(increment):
    """torch.autograd.graph.increment_version as a call over a list of tensors: torch's own where
    it takes a list (2.5 and later), one call per tensor where it takes a single one (2.1 to 2.4,
    which raise on a list; an inference tensor has no version to count there), None before 2.1
    (no such call)."""
    if increment is None:
        return None
    try:
        increment([])
        return increment
    except (TypeError, RuntimeError):
        return lambda tensors: [increment(t) for t in tensors if not t.is_inference()]


_increment_version = _version_bumper(
    getattr(getattr(torch.autograd, "graph", None), "increment_version", None))

# zb_adam_tensor as 64-bit words: 6 pointers and sizes, the hyper pointer, the step (>= 0)
_WORDS = 8
assert ctypes.sizeof(_native.AdamTensor) == 8 * _WORDS


def _number(name, value):
    """A hyperparameter as a float: any real number (numpy's scalars too) or a one-element
    tensor, never a bool."""
    if type(value) is float or type(value) is int:  # most of them, without the ABC check
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__} ({value!r})")
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(f"{name} as a tensor must have one element, not {value.numel()}")
    return float(value)


def checked_hyper(lr, betas, eps, weight_decay, adamw=True, bias_correction=True):
    """The hyperparameters as the kernel takes them (a zb_adam_hyper), or TypeError/ValueError
    naming the one refused: numbers (never a bool), betas a pair, and the ranges libzenbind's
    (zb_adam_hyper_check, torch's ranges) on the float32 values the kernel computes with."""
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise TypeError(f"betas must be a pair of numbers, not {betas!r}")
    lr, eps, weight_decay = (_number(n, v) for n, v in
                             (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)))
    beta1, beta2 = (_number("betas", b) for b in betas)
    for i, beta in enumerate((beta1, beta2)):
        if beta < 1.0 and ctypes.c_float(beta).value == 1.0:
            raise ValueError(f"invalid betas: betas[{i}] = {beta!r} is 1 in float32, which the "
                             f"kernel computes in (its largest below 1 is 0.99999994)")
    hyper = _native.hyper(lr, (beta1, beta2), eps, weight_decay, adamw, bias_correction)
    _native.check_hyper(hyper)
    return hyper


def _step(value):
    """A step number as torch keeps it (an int, numpy's too, or a one-element tensor of a whole
    number)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int)) and \
            float(value).is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        raise ValueError(f"step must be a whole number from 1 to 2**63 - 1, not {value!r}")
    return value


def _threads(value, least=0):
    """A thread count for zb_adam_step: from `least` (0: OpenMP's default) to
    ZB_ADAM_MAX_THREADS."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not least <= value <= _native.ADAM_MAX_THREADS:
        raise ValueError(f"threads must be {'0 (OpenMP default) or ' if least == 0 else ''}a "
                         f"count from 1 to {_native.ADAM_MAX_THREADS}, not {value!r}")
    return int(value)


def torch_threads():
    """This process's torch thread count, as the kernels take it (at most ZB_ADAM_MAX_THREADS)."""
    return min(torch.get_num_threads(), _native.ADAM_MAX_THREADS)


def _check(what, i, t, dtypes, numel):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}[{i}] is a {type(t).__name__}, not a tensor")
    if t.device.type != "cpu":
        raise ValueError(f"{what}[{i}] is on {t.device}: this step runs on CPU tensors")
    if t.dtype not in dtypes:
        raise TypeError(f"{what}[{i}] is {t.dtype}, not one of {', '.join(map(str, dtypes))}")
    if t.layout != torch.strided:
        raise ValueError(f"{what}[{i}] is {t.layout}: this step runs on dense tensors")
    if not t.is_contiguous():
        raise ValueError(f"{what}[{i}] is not contiguous")
    if t.is_neg() or t._is_zerotensor():  # the kernel reads and writes memory, not the flags
        form = "lazily negated" if t.is_neg() else "zeros without memory"
        raise ValueError(f"{what}[{i}] is {form}: pass its values (.clone())")
    if t.numel() != numel:
        raise ValueError(f"{what}[{i}] has {t.numel()} elements, its parameter {numel}")


@eager
def adamw_(params, grads, exp_avgs, exp_avg_sqs, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
           weight_decay=1e-2, adamw=True, bias_correction=True, maximize=False, grad_scale=1.0,
           skip_nonfinite=False, max_grad_norm=0.0, grad_norm=False, copy_out=None, threads=0):
    """One AdamW (adamw=False: Adam with L2) step, in place, over lists of CPU tensors:
      params, exp_avgs, exp_avg_sqs   fp32, contiguous (the master weights and the moments)
      grads                           fp32, bf16 or fp16, one dtype for all, contiguous
      copy_out                        None, or bf16/fp16 tensors that receive the updated params
      step                            the step number (>= 1), for bias correction, or one
                                      per tensor (torch counts steps per parameter)
      grad_scale                      multiplies every gradient first (1/loss_scale)
      skip_nonfinite                  a non-finite scaled gradient anywhere: nothing is written
      max_grad_norm                   > 0: clip by the global L2 norm, as clip_grad_norm_
      threads                         OpenMP threads (0: OpenMP's default)
    Returns a StepResult. Raises before writing anything on bad input, a tensor written that
    starts where another one does included (a parameter listed twice); other overlaps of the
    tensors written with each other or with those read are undefined."""
    lists = (params, grads, exp_avgs, exp_avg_sqs) + ((copy_out,) if copy_out is not None else ())
    if len({len(x) for x in lists}) != 1:
        raise ValueError("params, grads, exp_avgs, exp_avg_sqs (and copy_out) must be lists of "
                         "the same length, not " + ", ".join(str(len(x)) for x in lists))
    steps = [_step(s) for s in step] if isinstance(step, (list, tuple)) else None
    if steps is not None and len(steps) != len(params):
        raise ValueError(f"step has {len(steps)} numbers for {len(params)} params")
    base_step = 1 if steps is not None else _step(step)
    hyper = checked_hyper(lr, betas, eps, weight_decay, adamw, bias_correction)
    grad_scale = _number("grad_scale", grad_scale)
    grad_dtypes = {g.dtype for g in grads if isinstance(g, torch.Tensor)}
    if len(grad_dtypes) > 1:
        raise TypeError(f"grads must have one dtype, not {sorted(map(str, grad_dtypes))}")
    grad_dtype = grad_dtypes.pop() if grad_dtypes else torch.float32
    copy_dtypes = {c.dtype for c in copy_out or () if isinstance(c, torch.Tensor)}
    if len(copy_dtypes) > 1:
        raise TypeError(f"copy_out must have one dtype, not {sorted(map(str, copy_dtypes))}")
    copy_dtype = copy_dtypes.pop() if copy_dtypes else None
    fp32 = (torch.float32,)
    for i, p in enumerate(params):
        _check("params", i, p, fp32, p.numel() if isinstance(p, torch.Tensor) else -1)
        _check("grads", i, grads[i], tuple(DTYPE_NAMES), p.numel())
        _check("exp_avgs", i, exp_avgs[i], fp32, p.numel())
        _check("exp_avg_sqs", i, exp_avg_sqs[i], fp32, p.numel())
        if copy_out is not None:
            _check("copy_out", i, copy_out[i], (torch.bfloat16, torch.float16), p.numel())
    _distinct(params, grads, exp_avgs, exp_avg_sqs, copy_out)
    rows = Rows()
    for i, p in enumerate(params):
        rows.add(p, grads[i], exp_avgs[i], exp_avg_sqs[i],
                 copy_out[i] if copy_out is not None else None, 0, steps[i] if steps else 0)
    return launch(rows, grad_dtype, copy_dtype, hyper, base_step,
                  -grad_scale if maximize else grad_scale, skip_nonfinite,
                  _number("max_grad_norm", max_grad_norm), bool(grad_norm), _threads(threads))


def _distinct(params, grads, exp_avgs, exp_avg_sqs, copy_out):
    """Refuse a tensor the step writes that starts where another one written or read does (a
    parameter listed twice, exp_avg given as exp_avg_sq, a gradient that is its parameter):
    the kernel's threads would race on it. A partial overlap stays the caller's to avoid."""
    written = {}
    for what, tensors in (("params", params), ("exp_avgs", exp_avgs),
                          ("exp_avg_sqs", exp_avg_sqs), ("copy_out", copy_out or ())):
        for i, t in enumerate(tensors):
            if t.numel():
                other = written.setdefault(t.data_ptr(), f"{what}[{i}]")
                if other != f"{what}[{i}]":
                    raise ValueError(f"{what}[{i}] is the memory of {other}: each tensor the "
                                     "step writes must be its own")
    for i, g in enumerate(grads):
        other = written.get(g.data_ptr()) if g.numel() else None
        if other is not None:
            raise ValueError(f"grads[{i}] is the memory of {other}, which the step writes")


def adam_args(grad_dtype, grad_scale, threads):
    """A zb_adam_args as zb_adam_args_init() makes it, with these gradients and threads."""
    args = _native.AdamArgs()
    _native.library().zb_adam_args_init_size(ctypes.byref(args), ctypes.sizeof(args))
    args.grad = _native.DTYPES[DTYPE_NAMES[grad_dtype]]
    args.grad_scale = grad_scale
    args.threads = threads
    return args


def _as_tensors(words):
    """The zb_adam_tensor array over `words` (_WORDS a tensor, 0 for NULL; one row of zeros when
    there are none), without a copy: the words must stay unchanged and alive through the call."""
    if not words:
        words = array.array("Q", [0] * _WORDS)
    return (_native.AdamTensor * (len(words) // _WORDS)).from_buffer(words)


def tensor_array(rows):
    """A zb_adam_tensor array of rows of _WORDS integers each, packed as words: a ctypes struct
    made per tensor cost more than the kernel for small tensors. Whatever a row points to must
    outlive the call it is passed to."""
    flat = array.array("Q")
    for row in rows:
        flat.extend(row)
    return _as_tensors(flat)


class Rows:
    """The zb_adam_tensor rows of one zb_adam_step call, packed as words (_WORDS per tensor: a
    ctypes struct made per tensor cost more than the kernel for small tensors), with the tensors
    the kernel writes (their versions go up after it) and whatever else the rows point into (kept
    alive until the call returns)."""

    __slots__ = ("words", "written", "alive", "hyper")

    def __init__(self, hyper=None):
        self.words, self.written, self.alive = array.array("Q"), [], []
        self.hyper = hyper  # a _native.Hyper for rows without their own, if the caller keeps one

    def __len__(self):
        return len(self.words) // _WORDS

    def add(self, param, grad, exp_avg, exp_avg_sq, copy_out, hyper_address, step):
        """One tensor: hyper_address 0 and step 0 take the call's own."""
        self.words.extend((param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(),
                           exp_avg_sq.data_ptr(), 0 if copy_out is None else copy_out.data_ptr(),
                           param.numel(), hyper_address, step))
        self.written += (param, exp_avg, exp_avg_sq) if copy_out is None else \
            (param, exp_avg, exp_avg_sq, copy_out)
        self.alive.append(grad)


def launch(rows, grad_dtype, copy_dtype, hyper, step, grad_scale, skip_nonfinite, max_grad_norm,
           grad_norm, threads):
    """zb_adam_step over the Rows of checked CPU tensors; hyper and step for rows without their
    own."""
    lib = _native.library()
    args = adam_args(grad_dtype, grad_scale, threads)
    args.copy_out = _native.DTYPES[DTYPE_NAMES[copy_dtype] if copy_dtype else None]
    args.hyper = hyper
    args.step = step
    want_norm = grad_norm or skip_nonfinite or max_grad_norm > 0
    args.flags = (STEP_SKIP_NONFINITE if skip_nonfinite else 0) | \
        (STEP_GRAD_NORM if want_norm else 0)
    args.max_grad_norm = max_grad_norm
    result = _native.Result()
    _native.check(lib.zb_adam_step(_as_tensors(rows.words), len(rows), ctypes.byref(args),
                                   ctypes.byref(result)))
    if not result.skipped and _increment_version is not None:
        # written through their pointers: autograd and version checks see it, as after torch's
        # in-place step (torch < 2.1 has no call for it)
        _increment_version(rows.written)
    return StepResult(int(result.nonfinite), float(result.grad_norm) if want_norm else None,
                      bool(result.skipped), float(result.seconds))
