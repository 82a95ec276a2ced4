"""Shared pieces of the zenflow_bind.optim tests: seeded models, data and comparisons."""

import copy
import ctypes
import os

import torch

import zenflow_bind.optim as zt

THREADS = 2  # the worker's; the tests' machine has 2 shared cores


def mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(),
                               torch.nn.Linear(48, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4)).to(dtype)


def sharded_mlp(fully_shard, seed=0, device="cpu", **kw):
    """mlp() on device, each Linear and the whole sharded by FSDP2's fully_shard(**kw)."""
    model = mlp(seed).to(device)
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(24, 16, generator=g), torch.randn(24, 4, generator=g)) for _ in range(n)]


def groups_of(model):
    """Three groups with their own lr and weight decay, as a user would split a model."""
    m = model
    return [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
            {"params": [m[0].bias, m[2].bias, m[4].bias], "weight_decay": 0.0},
            {"params": [m[4].weight], "lr": 3e-3, "weight_decay": 0.02}]


def train(model, opt, data, scheduler=None):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def twins(seed=0, dtype=torch.float32):
    """Two identical models."""
    a = mlp(seed, dtype)
    return a, copy.deepcopy(a)


def ours(params, **kw):
    kw.setdefault("threads", THREADS)
    return zt.AdamW(params, **kw)


def assert_close(test, ours_params, ref_params, rtol=1e-5, atol=1e-5):
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=rtol, atol=atol)


def assert_equal(test, xs, ys):
    for a, b in zip(xs, ys):
        test.assertTrue(torch.equal(a.detach(), b.detach()), "not bit-identical")


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None once the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_PAGE = os.sysconf("SC_PAGE_SIZE")
_RESIDENT = ctypes.create_string_buffer(1)


def mapped(addresses):
    """How many of these addresses lie in a mapping of this process: mincore(2) of their page
    fails with ENOMEM where none does. It allocates nothing that could be mapped where memory
    was just unmapped, as reading /proc/self/maps would."""
    return sum(_LIBC.mincore(a - a % _PAGE, _PAGE, _RESIDENT) == 0 for a in addresses)


def alive(pid):
    """Whether pid runs (a zombie or a vanished process does not)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"
