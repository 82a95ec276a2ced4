"""zenflow_bind.optim.AdamW(worker=False): the same optimizer stepping in this process. It matches
torch.optim.AdamW, holds torch's state in torch's own optimizer.state, gives the same bits as the
worker on the same steps, and a checkpoint moves between the two modes without a difference; skip
and clip decide over every parameter at once; what it cannot do is refused."""

import copy
import unittest
import warnings

import torch

from torch_cases import assert_close, batches, groups_of, mlp, ours, train, twins
import zenflow_bind.optim as zt

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def local_opt(params, **kw):
    return zt.AdamW(params, worker=False, threads=2, **kw)


def train16(model, opt, data):
    """train() for a 16-bit model, the loss in fp32 (torch 1.13 has no bf16 mse_loss)."""
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(y.dtype)).float(), y.float()).backward()
        opt.step()


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

    def test_same_bits_as_the_worker_when_parameters_miss_steps(self):
        # Each parameter's own count in both: layer 2's bias without a gradient at steps 3-6,
        # layer 4's weight frozen for the first 5 steps, one group.
        models = twins()
        for m in models:
            m[4].weight.requires_grad_(False)
        opts = [zt.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, threads=1, worker=w)
                for m, w in zip(models, (True, False))]
        for i, (x, y) in enumerate(batches(12)):
            for m, opt in zip(models, opts):
                m[4].weight.requires_grad_(i >= 5)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(m(x), y).backward()
                if 2 <= i <= 5:
                    m[2].bias.grad = None
                opt.step()
        opts[0].close()
        self.assertEqual(bits(models[0]), bits(models[1]))

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

    def test_resumes_a_torch_adamw_checkpoint(self):
        # torch's state dict lacks adamw_mode and bias_correction, and a transposed parameter's
        # moments are laid out as the parameter is (not contiguous)
        a, b = twins()
        a[0].weight = torch.nn.Parameter(a[0].weight.detach().t().contiguous().t())
        b[0].weight = torch.nn.Parameter(b[0].weight.detach().t().contiguous().t())
        self.assertFalse(a[0].weight.is_contiguous())
        data = batches(8)
        ref = torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False)
        train(b, ref, data[:4])
        self.assertFalse(ref.state[b[0].weight]["exp_avg"].is_contiguous())
        a.load_state_dict(b.state_dict())
        opt = local_opt(a.parameters(), lr=1e-2)
        opt.load_state_dict(copy.deepcopy(ref.state_dict()))
        train(a, opt, data[4:])
        train(b, ref, data[4:])
        assert_close(self, a.parameters(), b.parameters())

    def test_assigned_state_is_made_ready_for_the_kernel(self):
        # zeros_like(p) of a bf16 parameter is bf16; of a transposed one, transposed: each is
        # copied to fp32 in the parameter's element order, never read as something else
        model = mlp(dtype=torch.bfloat16)
        opt = local_opt(model.parameters(), lr=1e-2)
        ref_model = copy.deepcopy(model)
        ref = local_opt(ref_model.parameters(), lr=1e-2)
        data = [(x.bfloat16(), y.bfloat16()) for x, y in batches(4)]
        train16(model, opt, data[:2])
        train16(ref_model, ref, data[:2])
        for o, m in ((opt, model), (ref, ref_model)):
            p = next(m.parameters())
            reset = torch.zeros_like(p) if o is opt else torch.zeros_like(p, dtype=torch.float32)
            o.state[p]["exp_avg"] = reset
        train16(model, opt, data[2:])
        train16(ref_model, ref, data[2:])
        self.assertEqual(bits(model), bits(ref_model))
        self.assertEqual(opt.state[next(model.parameters())]["exp_avg"].dtype, torch.float32)
        p = next(model.parameters())
        before = bits(model)
        for wrong in (torch.zeros(3), torch.zeros(p.shape[::-1])):  # (transposed: scrambled)
            opt.state[p]["exp_avg"] = wrong
            with self.assertRaisesRegex(ValueError, rf"parameter 0: exp_avg has shape "
                                                    rf"\({wrong.shape[0]},"):
                train16(model, opt, data[:1])
            self.assertEqual(bits(model), before)

    def test_a_16_bit_parameter_written_by_the_user_becomes_the_master(self):
        for worker in (True, False):
            with self.subTest(worker=worker):
                model = mlp(dtype=torch.bfloat16)
                opt = zt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, worker=worker)
                data = [(x.bfloat16(), y.bfloat16()) for x, y in batches(2)]
                train16(model, opt, data[:1])
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(0.5)
                train16(model, opt, data[1:])  # one step from 0.5, a few lr at most
                for p in model.parameters():
                    self.assertLess(float((p.float() - 0.5).abs().max()), 0.05)
                opt.close()

    def test_steps_during_backward_is_the_plain_step(self):
        a, b = twins()
        x, y = batches(1)[0]
        opt_a, opt_b = local_opt(a.parameters()), local_opt(b.parameters())
        with opt_a.step_during_backward(grad_scale=0.5):
            torch.nn.functional.mse_loss(a(x), y).backward()
        opt_a.step()
        torch.nn.functional.mse_loss(b(x), y).backward()
        opt_b.step(grad_scale=0.5)
        self.assertEqual(bits(a), bits(b))
        with opt_a.step_during_backward(grad_scale=0.5):
            pass
        with self.assertRaisesRegex(ValueError, "give it once"):
            opt_a.step(grad_scale=2.0)
        opt_a.step(grad_scale=None)  # None: 1

    def test_copies_and_pickles_as_torch_adamw_does(self):
        import pickle
        model = mlp()
        opt = local_opt(model.parameters(), lr=1e-2)
        train(model, opt, batches(2))
        for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
            params = clone.param_groups[0]["params"]
            self.assertEqual(clone.threads, 2)
            for p, q in zip(params, model.parameters()):
                self.assertIsNot(p, q)
                torch.testing.assert_close(clone.state[p]["exp_avg"], opt.state[q]["exp_avg"])
            for p in params:
                p.grad = torch.ones_like(p)
            clone.step()
            self.assertEqual(float(clone.state[params[0]]["step"]), 3.0)
            self.assertIn("state", clone.state_dict())
        with ours(model.parameters()) as worker_opt:
            for copier in (copy.deepcopy, pickle.dumps):
                with self.assertRaisesRegex(TypeError, "cannot be pickled or copied"):
                    copier(worker_opt)

    def test_hyperparameters_as_torch_takes_them_and_a_parameter_listed_once(self):
        import numpy as np
        a, b = twins()
        data = batches(3)
        opt_a = local_opt(a.parameters(), lr=np.float32(1e-2), betas=(np.float32(0.9), 0.999))
        opt_b = torch.optim.AdamW(b.parameters(), lr=float(np.float32(1e-2)))
        train(a, opt_a, data)
        train(b, opt_b, data)
        assert_close(self, a.parameters(), b.parameters())
        p = next(mlp().parameters())
        for worker in (True, False):
            with self.assertRaisesRegex(ValueError, "listed twice"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's own: "will cause an error" one day
                zt.AdamW([p, p], worker=worker)
            with self.assertRaisesRegex(ValueError, "betas\\[1\\] = 0.99999999 is 1 in float32"):
                zt.AdamW([p], betas=(0.9, 0.99999999), worker=worker)

    def test_a_bad_step_count_is_refused_before_anything_changes(self):
        model = mlp()
        opt = local_opt(model.parameters())
        train(model, opt, batches(2))
        good = copy.deepcopy(opt.state_dict())
        for step in (-3, 2.5, "x"):
            bad = copy.deepcopy(good)
            bad["state"][1]["step"] = step
            bad["param_groups"][0]["lr"] = 0.5
            with self.subTest(step=step), self.assertRaisesRegex((TypeError, ValueError),
                                                                  "parameter 1: step must be"):
                opt.load_state_dict(bad)
            self.assertEqual(opt.param_groups[0]["lr"], good["param_groups"][0]["lr"])
            self.assertEqual(float(opt.state[list(model.parameters())[1]]["step"]), 2.0)

    def test_each_kind_of_step_count_counts_once(self):
        # torch's own (fp32; fp64 under a float64 default dtype), loaded ones, numbers, a view:
        # each one more after a step, a tensor's version counted as by torch's in-place add
        model = mlp()
        opt = local_opt(model.parameters())
        train(model, opt, batches(1))
        params = list(model.parameters())  # six
        shared = torch.tensor([7.0, 7.0])
        counts = [torch.tensor(1.0), torch.tensor(1.0, dtype=torch.float64),
                  torch.tensor(1, dtype=torch.int64), 1, shared[1], torch.tensor([1.0])]
        for p, c in zip(params, counts):
            opt.state[p]["step"] = c
        versions = [c._version if isinstance(c, torch.Tensor) else None for c in counts]
        train(model, opt, batches(1))
        for i, (p, before) in enumerate(zip(params, (1, 1, 1, 1, 7, 1))):
            with self.subTest(i=i):
                self.assertEqual(float(opt.state[p]["step"]), before + 1)
                if versions[i] is not None:
                    self.assertGreater(opt.state[p]["step"]._version, versions[i])
        self.assertEqual(shared.tolist(), [7.0, 8.0])
        self.assertEqual(opt.state[params[1]]["step"].dtype, torch.float64)

    def test_a_parameter_whose_dtype_changed_is_refused(self):
        model = mlp()
        opt = local_opt(model.parameters())
        train(model, opt, batches(1))
        p = next(model.parameters())
        p.data = p.data.double()
        p.grad = torch.ones_like(p)
        before = [t.clone() for t in model.parameters()]
        with self.assertRaisesRegex(TypeError, "parameter 0 is torch.float64 now"):
            opt.step()
        for a, b in zip(before, model.parameters()):
            self.assertTrue(torch.equal(a, b))
        p.data = p.data.bfloat16()
        p.grad = torch.ones_like(p)
        with self.assertRaisesRegex(TypeError, "parameter 0 is torch.bfloat16, and its state "
                                               "has no master_param"):
            opt.step()

    def test_tensors_reseated_to_another_size_or_place_are_refused(self):
        # .data = re-seats a tensor in place: the same object, another count, dtype or device.
        # The kernel walks the parameter's count through every buffer, so each is checked at
        # every step, before anything is written (this read and wrote past their ends).
        def resized(p, state):
            p.data = torch.randn(1 << 16)
            p.grad = torch.randn(1 << 16)

        cases = {
            "the parameter resized": (resized, "has 65536 elements and its exp_avg 4"),
            "its gradient shrunk": (lambda p, s: setattr(p.grad, "data", torch.randn(3)),
                                    "has 4 elements and its grad 3"),
            "exp_avg shrunk": (lambda p, s: setattr(s["exp_avg"], "data", torch.zeros(2)),
                               "its exp_avg 2"),
            "exp_avg_sq made fp64": (lambda p, s: setattr(s["exp_avg_sq"], "data",
                                                          torch.zeros(4, dtype=torch.float64)),
                                     "its exp_avg_sq is now a torch.float64 tensor"),
            "exp_avg made strided": (lambda p, s: setattr(s["exp_avg"], "data",
                                                          torch.zeros(8)[::2]),
                                     "not contiguous"),
        }
        # a 16-bit parameter's fp32 master (16-bit, it was written past its end)
        for dtype in (torch.bfloat16, torch.float64):
            cases[f"master_param made {dtype}"] = (
                lambda p, s, dtype=dtype: setattr(s["master_param"], "data",
                                                  torch.zeros(4, dtype=dtype)),
                f"its master_param is now a {dtype} tensor", torch.bfloat16)
        for name, (reseat, says, *dtype) in cases.items():
            with self.subTest(name):
                p = torch.nn.Parameter(torch.randn(4, dtype=(dtype or [torch.float32])[0]))
                p.grad = torch.randn(4, dtype=p.dtype)
                opt = local_opt([p])
                opt.step()
                reseat(p, opt.state[p])
                before = (p.detach().clone(), [t.clone() for t in opt.state[p].values()])
                with self.assertRaisesRegex(ValueError, f"parameter 0.*{says}"):
                    opt.step()
                self.assertTrue(torch.equal(p.detach(), before[0]), "nothing written")
                for a, b in zip(opt.state[p].values(), before[1]):
                    self.assertTrue(torch.equal(a, b), "nothing written")

    def test_gradients_in_torchs_lazy_forms_step_as_their_values(self):
        # A custom autograd.Function may return torch's zeros without memory (data_ptr 0; the
        # kernel refused it, and with fp32 and bf16 parameters, two kernel calls, the fp32 ones
        # had stepped when the bf16 one failed: a torn step), and a gradient may carry the
        # negation flag (the kernel read the memory without it: the step went the other way)
        class Zeros(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                return torch._efficientzerotensor(g.shape, dtype=g.dtype)

        for form in ("zeros", "negated"):
            with self.subTest(form):
                got = []
                for lazy in (True, False):
                    torch.manual_seed(0)
                    a = torch.nn.Parameter(torch.randn(8))
                    b = torch.nn.Parameter(torch.randn(8).bfloat16())
                    opt = local_opt([a, b])
                    for _ in range(2):
                        opt.zero_grad(set_to_none=True)  # (torch cannot zero_() those)
                        if form == "zeros" and lazy:
                            (Zeros.apply(a).sum() + Zeros.apply(b).float().sum()).backward()
                            self.assertTrue(a.grad._is_zerotensor())
                        elif form == "zeros":
                            a.grad, b.grad = torch.zeros(8), torch.zeros(8, dtype=b.dtype)
                        else:  # -1 everywhere, as a flag on ones or as values
                            a.grad, b.grad = (torch._neg_view(t) if lazy else -t for t in
                                              (torch.ones(8), torch.ones(8, dtype=b.dtype)))
                            self.assertEqual(a.grad.is_neg(), lazy)
                        opt.step()
                    got.append(bits(torch.nn.ParameterList([a, b])))
                self.assertEqual(got[0], got[1])

    def test_a_non_leaf_tensor_that_retains_its_gradient(self):
        # torch optimizes one; the worker has no hook for it and copies its gradient at step()
        for worker in (True, False):
            with self.subTest(worker=worker):
                w = torch.nn.Parameter(torch.randn(6))
                x, ref_x = w * 2, (w * 2).detach().requires_grad_()
                x.retain_grad()
                opt = zt.AdamW([x], lr=1e-2, worker=worker)
                ref = torch.optim.AdamW([ref_x], lr=1e-2)
                for t in (x, ref_x):
                    t.sin().sum().backward(retain_graph=True)
                opt.step()
                ref.step()
                torch.testing.assert_close(x.detach(), ref_x.detach())
                opt.close()

    def test_a_step_is_an_in_place_write_to_autograd(self):
        # as after torch's step: a graph built before it cannot be backpropagated through
        if not hasattr(getattr(torch.autograd, "graph", None), "increment_version"):
            self.skipTest(f"torch {torch.__version__} has no increment_version")
        model = mlp()
        opt = local_opt(model.parameters())
        x, y = batches(1)[0]
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = [p._version for p in model.parameters()]
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.step()
        self.assertTrue(all(p._version > v for p, v in zip(model.parameters(), before)))
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            loss.backward()

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
        for threads in (0, 1025, 2**32 + 1, 1.0, True):  # (ctypes' int wraps 2**32 + 1 to 1)
            with self.assertRaisesRegex(ValueError, "threads must be a count from 1"):
                zt.AdamW(params, worker=False, threads=threads)


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
