"""zenflow_bind.optim.AdamW under DistributedDataParallel, as most data-parallel trainers run it:
two gloo ranks, each with its own batches, with and without gradient_as_bucket_view, and with
buckets small enough that DDP averages several per backward. Each step must take DDP's averaged
gradients, though the worker's hook copies each gradient as soon as backward produces it, before
DDP has averaged it: training matches torch.optim.AdamW on the same model. test_gpu.py runs the
same on a CUDA model."""

import os
import tempfile
import unittest

import torch
import torch.distributed as dist

from torch_cases import batches, mlp

STEPS = 5


def parity(rank, world, store, device, view, out):
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    try:
        import zenflow_bind.optim as zt
        data = [(x.to(device), y.to(device)) for x, y in batches(STEPS, seed=11 + rank)]
        got = {}
        for name in ("ours", "torch"):
            model = torch.nn.parallel.DistributedDataParallel(
                mlp(0).to(device), gradient_as_bucket_view=view, bucket_cap_mb=0.001)
            if name == "ours":
                opt = zt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, threads=1)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
            for x, y in data:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            got[name] = [p.detach().cpu().clone() for p in model.parameters()]
            if name == "ours":
                opt.close()
        if rank == 0:
            torch.save(got, out)
    finally:
        dist.destroy_process_group()


def run_parity(test, device):
    import torch.multiprocessing as mp
    for view in (False, True):
        with test.subTest(gradient_as_bucket_view=view), tempfile.TemporaryDirectory() as where:
            out = os.path.join(where, "parity.pt")
            mp.spawn(parity, args=(2, os.path.join(where, "store"), device, view, out), nprocs=2)
            got = torch.load(out)
            for a, b in zip(got["ours"], got["torch"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "no gloo")
class DataParallel(unittest.TestCase):
    def test_training_matches_torch_adamw(self):
        run_parity(self, "cpu")


if __name__ == "__main__":
    unittest.main()
