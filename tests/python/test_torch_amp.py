"""zenflow_bind.optim.AdamW under torch.amp.GradScaler (torch >= 2.3; skips before): the scaler
hands its scale and inf check to step(), which unscales in its kernel and skips as torch's AdamW
does, in both modes and with steps during backward.

The parameters are an fp32 and a bf16 tensor in one group, so the bf16 gradient is copied into the
worker's fp32 buffer by the backward hook, before the scaler sees it. The scale is a power of 2,
so scaled gradients are the plain ones times it, exactly: a scaled run equals a plain one to the
bit."""

import unittest

import torch

from torch_cases import THREADS, assert_equal
import zenflow_bind.optim as zt

SCALER = hasattr(getattr(torch, "amp", None), "GradScaler")
HOOKS = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(64)),
            torch.nn.Parameter(torch.randn(64).to(torch.bfloat16))]


def loss_of(ps, i, inf=False):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(64, generator=g), torch.randn(64, generator=g)
    loss = (ps[0] * x).square().sum() + (ps[1].float() * y).sin().sum()
    return loss * float("inf") if inf else loss


def ours(ps, worker, **kw):
    if worker:
        kw.setdefault("threads", THREADS)
    return zt.AdamW(ps, lr=1e-2, weight_decay=0.1, worker=worker, **kw)


def state_of(opt):
    return {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}


class Protocol(unittest.TestCase):
    def test_which_scalers_hand_their_scale_as_attributes(self):
        # torch 2.0 to 2.2 have torch.cuda.amp.GradScaler alone, which sets the attributes: a
        # check for torch.amp.GradScaler took them for 1.13's, which passes grad_scaler=, and the
        # gradients the hooks had copied were stepped still scaled
        from zenflow_bind._amp import SUPPORTED, hands_attributes

        class Passes:  # torch 1.13's
            def step(self, optimizer, *args, **kwargs):
                return optimizer.step(*args, **dict(kwargs, grad_scaler=self))

        class Sets:  # torch 2.0's on
            def step(self, optimizer, *args, **kwargs):
                optimizer.grad_scale, optimizer.found_inf = 1.0, 0.0
                return optimizer.step(*args, **kwargs)

        self.assertFalse(hands_attributes(Passes))
        self.assertTrue(hands_attributes(Sets))
        self.assertEqual(SUPPORTED, hands_attributes(torch.cuda.amp.GradScaler))
        self.assertEqual(zt.AdamW._step_supports_amp_scaling, SUPPORTED)
        self.assertEqual(SUPPORTED, torch.__version__ >= "2")  # 1.13, 2.6 and 2.14 in CI


@unittest.skipUnless(SCALER, f"torch {torch.__version__} has no torch.amp.GradScaler")
class Scaled(unittest.TestCase):
    def plain(self, worker, steps=4):
        ps = params()
        with ours(ps, worker) as opt:
            for i in range(steps):
                opt.zero_grad()
                loss_of(ps, i).backward()
                opt.step()
            return ps, state_of(opt)

    def scaled(self, worker, steps=4, unscale_first=False, inf_at=None, **kw):
        ps = params()
        scaler = torch.amp.GradScaler("cpu", init_scale=4096.0, growth_interval=1000)
        with ours(ps, worker, **kw) as opt:
            for i in range(steps):
                opt.zero_grad()
                scaler.scale(loss_of(ps, i, inf=i == inf_at)).backward()
                if unscale_first:
                    scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
                if i == inf_at:
                    self.assertTrue(opt.last_step_skipped)
            return ps, state_of(opt)

    def test_scaler_step_unscales_in_the_kernel(self):
        for worker in (True, False):
            for unscale_first in (False, True):
                with self.subTest(worker=worker, unscale_first=unscale_first):
                    ps, state = self.scaled(worker, unscale_first=unscale_first)
                    ref, ref_state = self.plain(worker)
                    assert_equal(self, ps, ref)
                    for i in ref_state:
                        for k in ref_state[i]:
                            self.assertTrue(torch.equal(state[i][k], ref_state[i][k]), k)

    def test_a_step_with_inf_is_skipped(self):
        """The inf step updates nothing and counts nothing: the run equals one that never had
        that batch (the scaler's backoff halves the scale, exactly)."""
        for worker in (True, False):
            with self.subTest(worker=worker):
                ps, state = self.scaled(worker, steps=5, inf_at=2)
                ps_ref = params()
                with ours(ps_ref, worker) as opt:
                    for i in (0, 1, 3, 4):
                        opt.zero_grad()
                        loss_of(ps_ref, i).backward()
                        opt.step()
                    ref_state = state_of(opt)
                assert_equal(self, ps, ps_ref)
                self.assertEqual([float(s["step"]) for s in state.values()], [4.0, 4.0])
                for i in ref_state:
                    self.assertTrue(torch.equal(state[i]["exp_avg"], ref_state[i]["exp_avg"]))

    @unittest.skipUnless(HOOKS, "steps during backward need torch >= 2.1")
    def test_steps_during_backward(self):
        ps = params()
        scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
        with ours(ps, True, bucket_elements=64) as opt:
            for i in range(4):
                opt.zero_grad()
                with opt.step_during_backward(grad_scale=1 / scaler.get_scale()):
                    scaler.scale(loss_of(ps, i)).backward()
                self.assertTrue(opt._stream is not None and opt._stream.stepped)
                scaler.step(opt)
                scaler.update()
        ref, _ = self.plain(True)
        assert_equal(self, ps, ref)

    @unittest.skipUnless(HOOKS, "steps during backward need torch >= 2.1")
    def test_steps_during_backward_refusals(self):
        ps = params()
        scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
        with ours(ps, True, bucket_elements=64) as opt:
            saved = opt.state_dict()
            with opt.step_during_backward():  # not told the scale
                scaler.scale(loss_of(ps, 0)).backward()
            with self.assertRaisesRegex(ValueError, "taken with.*scaler.get_scale"):
                scaler.step(opt)
            self.assertFalse(hasattr(opt, "grad_scale") or hasattr(opt, "found_inf"))
            scaler.update()
            opt.zero_grad()
            with opt.step_during_backward(grad_scale=1 / scaler.get_scale()):
                scaler.scale(loss_of(ps, 1, inf=True)).backward()
            with self.assertRaisesRegex(RuntimeError, "skip_nonfinite=True"):
                scaler.step(opt)
            self.assertFalse(hasattr(opt, "grad_scale") or hasattr(opt, "found_inf"))
            with self.assertRaisesRegex(RuntimeError, "load_state_dict"):
                opt.step()
            opt.load_state_dict(saved)  # then plain steps step, as the message says
            before = [p.detach().clone() for p in ps]
            opt.zero_grad()
            loss_of(ps, 2).backward()
            opt.step()
            self.assertFalse(opt.last_step_skipped)
            self.assertFalse(any(torch.equal(p, q) for p, q in zip(ps, before)))
        # skip_nonfinite: the buckets wait for step(), and an inf step is skipped; a scale
        # that is not the scaler's is refused before anything is stepped
        ps = params()
        scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
        with ours(ps, True, bucket_elements=64, skip_nonfinite=True) as opt:
            with opt.step_during_backward(grad_scale=0.5):
                scaler.scale(loss_of(ps, 0)).backward()
            before = [p.detach().clone() for p in ps]
            with self.assertRaisesRegex(ValueError, "no step was taken"):
                scaler.step(opt)
            assert_equal(self, ps, before)
            self.assertEqual(opt.state_dict()["state"], {})
            scaler.update()
            for i, inf in ((0, False), (1, True), (2, False)):
                opt.zero_grad()
                with opt.step_during_backward(grad_scale=1 / scaler.get_scale()):
                    scaler.scale(loss_of(ps, i, inf=inf)).backward()
                scaler.step(opt)
                scaler.update()
                self.assertEqual(opt.last_step_skipped, inf)
            self.assertEqual([float(s["step"]) for s in state_of(opt).values()], [2.0, 2.0])


if __name__ == "__main__":
    unittest.main()
