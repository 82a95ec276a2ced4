"""zenflow_bind.optim.AdamW under FSDP2 on a CUDA GPU, as a torch 2.x user runs it: one NCCL rank,
the model sharded (fully_shard) on the GPU, in fp32 and with a bf16 MixedPrecisionPolicy, and
with CPUOffloadPolicy (its CPU shards stepped in the worker or in process). Training matches
torch.optim.AdamW under the same sharding; a distributed checkpoint (DCP) of the model and the
optimizer resumes bit-identical to a straight run; in-process stepping of shards left on the GPU
is refused. Skips without CUDA and NCCL (CI has neither): bench/gpu_run.sh runs it on a GPU
machine. test_torch_fsdp2.py covers several ranks and resharding, on CPU."""

import contextlib
import os
import tempfile
import unittest
import warnings

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA: deterministic cuBLAS

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torch_cases import batches, ours, sharded_mlp  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
except (ImportError, ValueError):  # ValueError: torch 1.13's FSDP under Python 3.11
    try:
        from torch.distributed._composable.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy,
                                                        fully_shard)
    except (ImportError, ValueError):
        fully_shard = None

LR = 1e-3
STEPS = 6


def missing():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if fully_shard is None:
        return f"torch {torch.__version__} has no fully_shard (FSDP2)"
    if not dist.is_nccl_available():
        return "this torch has no NCCL"
    return None


def sharded(seed=0, bf16=False, offload=False):
    """mlp() on the GPU, sharded by FSDP2 over the one rank."""
    kw = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    return sharded_mlp(fully_shard, seed, "cuda", **kw)


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        # mse_loss's CUDA backward wants one dtype: a bf16 policy's output is bf16
        torch.nn.functional.mse_loss(model(x.cuda()).float(), y.cuda()).backward()
        opt.step()


def full(model):
    return [p.full_tensor().detach().cpu() for p in model.parameters()]


@contextlib.contextmanager
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


@unittest.skipIf(missing(), missing())
class GpuFullyShard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.cuda.set_device(0)
        cls.where = tempfile.TemporaryDirectory()
        dist.init_process_group("nccl", store=dist.FileStore(os.path.join(cls.where.name, "s"),
                                                             1), rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        cls.where.cleanup()

    def test_training_matches_torch_adamw(self):
        data = batches(STEPS, seed=11)
        for bf16, offload, worker in ((False, False, True), (True, False, True),
                                      (False, True, True), (False, True, False)):
            with self.subTest(bf16=bf16, offload=offload, worker=worker):
                a, b = sharded(bf16=bf16, offload=offload), sharded(bf16=bf16, offload=offload)
                want = "cpu" if offload else "cuda"
                self.assertEqual(next(a.parameters()).to_local().device.type, want)
                with ours(a.parameters(), lr=LR, weight_decay=0.05, worker=worker) as opt:
                    train(a, opt, data)
                    state = opt.state[next(a.parameters())]
                    self.assertEqual(type(state["exp_avg"]).__name__, "DTensor")
                    got = full(a)
                train(b, torch.optim.AdamW(b.parameters(), lr=LR, weight_decay=0.05), data)
                # fp32: two roundings of one AdamW. bf16 compute: a last-bit difference in a
                # parameter can round its bf16 copy the other way, so up to half a step's lr
                atol = LR / 2 if bf16 else 1e-5
                for p, q in zip(got, full(b)):
                    torch.testing.assert_close(p, q, rtol=1e-4, atol=atol)

    def test_a_distributed_checkpoint_resumes_bit_identical(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        data = batches(STEPS, seed=11)
        half = STEPS // 2
        for bf16 in (False, True):
            with self.subTest(bf16=bf16), deterministic(), \
                    tempfile.TemporaryDirectory() as where:
                straight = sharded(bf16=bf16)
                with ours(straight.parameters(), lr=LR) as opt:
                    train(straight, opt, data[:half])
                    model_sd, optim_sd = get_state_dict(straight, opt)
                    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=where)
                    train(straight, opt, data[half:])
                    want = full(straight)
                resumed = sharded(seed=5, bf16=bf16)
                with ours(resumed.parameters(), lr=LR) as opt:
                    model_sd, optim_sd = get_state_dict(resumed, opt)
                    sd = {"model": model_sd, "optim": optim_sd}
                    dcp.load(sd, checkpoint_id=where)
                    set_state_dict(resumed, opt, model_state_dict=sd["model"],
                                   optim_state_dict=sd["optim"])
                    train(resumed, opt, data[half:])
                    got = full(resumed)
                for p, q in zip(got, want):
                    self.assertTrue(torch.equal(p, q), "the resumed run is not the straight one")

    def test_in_process_refuses_shards_on_the_gpu(self):
        model = sharded()
        with self.assertRaisesRegex(ValueError, "worker=False every parameter is on the CPU"):
            ours(model.parameters(), lr=LR, worker=False)


if __name__ == "__main__":
    unittest.main()
