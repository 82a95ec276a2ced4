"""zenflow_bind.optim.AdamW(worker=False): the same optimizer stepping in this process. It matches
torch.optim.AdamW, holds torch's state in torch's own optimizer.state, gives the same bits as the
worker on the same steps, and a checkpoint moves between the two modes without a difference; skip
and clip decide over every parameter at once; what it cannot do is refused."""

import copy
import unittest
import warnings

import torch

from torch_cases import assert_close, batches, groups_of, mlp, train, twins
import zenflow_bind.optim as zt

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def local_opt(params, **kw):
    return zt.AdamW(params, worker=False, threads=2, **kw)


def bits(model):
    """The model's parameters as bytes: equal means bit for bit."""
    return [p.detach().contiguous().view(torch.uint8).numpy().tobytes()
            for p in model.parameters()]


class InProcess(unittest.TestCase):
    def test_is_the_optimizer_without_a_worker(self):
        opt = local_opt(mlp().parameters())
        self.assertIsInstance(opt, zt.AdamW)
        self.assertIsNone(opt.worker)
        self.assertIsInstance(opt.state, dict)

    def test_matches_torch_adamw_with_groups_and_a_scheduler(self):
        a, b = twins()
        data = batches(20)
        opt_a, opt_b = local_opt(groups_of(a), lr=3e-2), torch.optim.AdamW(groups_of(b), lr=3e-2)
        sched = torch.optim.lr_scheduler.StepLR
        train(a, opt_a, data, sched(opt_a, step_size=4, gamma=0.5))
        train(b, opt_b, data, sched(opt_b, step_size=4, gamma=0.5))
        assert_close(self, a.parameters(), b.parameters())
        for p, q in zip(a.parameters(), b.parameters()):
            mine, theirs = opt_a.state[p], opt_b.state[q]
            self.assertEqual(sorted(mine), sorted(theirs))
            self.assertEqual(float(mine["step"]), float(theirs["step"]))
            torch.testing.assert_close(mine["exp_avg_sq"], theirs["exp_avg_sq"], rtol=1e-5,
                                       atol=1e-8)

    def test_same_bits_as_the_worker_and_checkpoints_move_between_modes(self):
        data = batches(8)
        straight, _ = twins()
        with zt.AdamW(straight.parameters(), lr=1e-2, threads=1) as opt:
            train(straight, opt, data)
        # in process all the way: the worker's bits
        alone = mlp()
        train(alone, local_opt(alone.parameters(), lr=1e-2), data)
        self.assertEqual(bits(alone), bits(straight))
        # worker for 4 steps, then in process from its checkpoint, and the other way round
        for first, second in ((dict(worker=True), dict(worker=False)),
                              (dict(worker=False), dict(worker=True))):
            model = mlp()
            opt = zt.AdamW(model.parameters(), lr=1e-2, threads=1, **first)
            train(model, opt, data[:4])
            saved = copy.deepcopy(opt.state_dict())
            opt.close()
            resumed = copy.deepcopy(model)
            opt = zt.AdamW(resumed.parameters(), lr=1e-2, threads=1, **second)
            opt.load_state_dict(saved)
            train(resumed, opt, data[4:])
            opt.close()
            self.assertEqual(bits(resumed), bits(straight), (first, second))

    def test_bf16_parameters_keep_an_fp32_master(self):
        model = mlp(dtype=torch.bfloat16)
        master = [p.detach().float().requires_grad_() for p in model.parameters()]
        ref = torch.optim.AdamW(master, lr=1e-4)
        opt = local_opt(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(3)
        for _ in range(20):
            for p, m in zip(model.parameters(), master):
                p.grad = torch.randn(p.shape, generator=gen).bfloat16()
                m.grad = p.grad.float()
            opt.step()
            ref.step()
        ours = [opt.state[p]["master_param"] for p in model.parameters()]
        self.assertTrue(all(m.dtype == torch.float32 for m in ours))
        assert_close(self, ours, master)
        for p, m in zip(model.parameters(), ours):
            self.assertTrue(torch.equal(p.detach(), m.bfloat16()))
        # a checkpoint keeps the moments and the master in fp32, which torch's load would cast
        saved = copy.deepcopy(opt.state_dict())
        again = local_opt(model.parameters(), lr=1e-4)
        again.load_state_dict(saved)
        for p in model.parameters():
            for key in ("exp_avg", "exp_avg_sq", "master_param"):
                self.assertEqual(again.state[p][key].dtype, torch.float32)
                self.assertTrue(torch.equal(again.state[p][key], opt.state[p][key]))

    def test_skip_and_clip_decide_over_every_dtype_at_once(self):
        # fp32 and bf16 parameters are two kernel calls; a NaN in the bf16 one skips both
        model = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4),
                                     "b": torch.nn.Linear(4, 4).bfloat16()})
        opt = local_opt(model.parameters(), skip_nonfinite=True, max_grad_norm=0.5)
        before = bits(model)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        model["b"].weight.grad[0, 0] = float("nan")
        opt.step()
        self.assertTrue(opt.last_step_skipped)
        self.assertEqual(opt.last_nonfinite, 1)
        self.assertEqual(bits(model), before)
        self.assertFalse(opt.state[model["a"].weight])  # no state: no step was taken
        # finite: one global norm over both, clipped to 0.5, as clip_grad_norm_
        for p in model.parameters():
            p.grad = torch.full_like(p, 2.0)
        opt.step()
        self.assertFalse(opt.last_step_skipped)
        self.assertAlmostEqual(opt.last_grad_norm, 2.0 * (2 * (16 + 4)) ** 0.5, places=4)
        self.assertNotEqual(bits(model)[0], before[0])

    def test_a_state_dict_missing_an_entry_changes_nothing(self):
        model = mlp()
        opt = local_opt(model.parameters())
        train(model, opt, batches(2))
        good = copy.deepcopy(opt.state_dict())
        bad = copy.deepcopy(good)
        del bad["state"][3]["exp_avg_sq"]
        with self.assertRaisesRegex(ValueError, "parameter 3: its state has no exp_avg_sq"):
            opt.load_state_dict(bad)
        self.assertTrue(all(torch.equal(opt.state[p]["exp_avg_sq"], good["state"][i]
                                        ["exp_avg_sq"]) for i, p in enumerate(model.parameters())))

    def test_what_needs_a_worker_is_refused(self):
        params = list(mlp().parameters())
        with self.assertRaisesRegex(ValueError, "needs worker=True"):
            zt.AdamW(params, worker=False, overlap=True)
        with self.assertRaisesRegex(ValueError, "cpus and mems place a worker"):
            zt.AdamW(params, worker=False, cpus="0")
        with self.assertRaisesRegex(ValueError, "every parameter is on the CPU"):
            zt.AdamW([torch.nn.Parameter(torch.empty(3, device="meta"))], worker=False)
        with self.assertRaisesRegex(ValueError, "amsgrad"):
            zt.AdamW(params, worker=False, amsgrad=True)


class DistributedCheckpoint(unittest.TestCase):
    def test_get_optimizer_state_dict_never_steps(self):
        try:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        except (ImportError, ValueError):
            self.skipTest(f"torch {torch.__version__} has no get_optimizer_state_dict")
        model = mlp()
        opt = local_opt(model.parameters())
        train(model, opt, batches(3))
        before = bits(model)
        sd = get_optimizer_state_dict(model, opt)
        self.assertEqual({float(s["step"]) for s in sd["state"].values()}, {3.0})
        self.assertEqual(bits(model), before)


if __name__ == "__main__":
    unittest.main()
