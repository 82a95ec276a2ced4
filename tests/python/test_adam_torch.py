"""zenflow_bind.functional.adamw_ (libzenbind's zb_adam_step, the kernels in this process) against
torch.optim.Adam and torch.optim.AdamW from the torch in use, and its refusals.

100 steps on the same parameters and gradients. Tolerance: torch orders its float operations
differently (no FMA, division by sqrt(bias_correction2)), so values differ by a few ulps per step;
after 100 steps we require |ours - torch| <= 1e-5 + 1e-5 * |torch| for params and moments. The bf16
copy-out must equal torch's own round-to-nearest-even of our params, bit for bit."""

import unittest

import torch

from zenflow_bind import functional
from zenflow_bind.functional import adamw_

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class AgainstTorch(unittest.TestCase):
    def run_steps(self, adamw, grad, threads, grad_scale=1.0, copy=None, n=10007, steps=100):
        lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01
        gen = torch.Generator().manual_seed(1234)
        ours = torch.randn(n, generator=gen)
        ref = torch.nn.Parameter(ours.clone())
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        opt = cls([ref], lr=lr, betas=betas, eps=eps, weight_decay=wd)
        m, v = torch.zeros(n), torch.zeros(n)
        out = torch.empty(n, dtype=DTYPES[copy]) if copy else None
        for step in range(1, steps + 1):
            g = torch.randn(n, generator=gen) * 0.1
            if grad == "bf16":
                g = g.bfloat16()
            scaled = (g.float() / grad_scale).to(g.dtype)  # what a loss-scaled backward gives
            self.assertTrue(torch.equal(scaled.float() * grad_scale, g.float()))
            found = adamw_([ours], [scaled], [m], [v], step=step, lr=lr, betas=betas, eps=eps,
                           weight_decay=wd, adamw=adamw, grad_scale=grad_scale,
                           copy_out=[out] if copy else None, threads=threads)
            self.assertEqual(found.nonfinite, 0)
            self.assertFalse(found.skipped)
            ref.grad = g.float()
            opt.step()
        state = opt.state[ref]
        torch.testing.assert_close(ours, ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m, state["exp_avg"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, state["exp_avg_sq"], rtol=1e-5, atol=1e-5)
        if copy:
            self.assertTrue(torch.equal(out.view(torch.int16), ours.to(out.dtype).view(torch.int16)))
        # The comparison is not vacuous: the params moved by much more than the tolerance.
        self.assertGreater((ref.detach() - torch.randn(n, generator=torch.Generator().manual_seed(
            1234))).abs().max().item(), 1e-2)

    def test_adamw_fp32(self):
        self.run_steps(adamw=True, grad="fp32", threads=1)

    def test_adamw_bf16_two_threads_copy_out(self):
        self.run_steps(adamw=True, grad="bf16", threads=2, copy="bf16")

    def test_adam_fp32_two_threads(self):
        self.run_steps(adamw=False, grad="fp32", threads=2)

    def test_adam_bf16_fp16_copy_out(self):
        self.run_steps(adamw=False, grad="bf16", threads=1, copy="fp16")

    def test_adamw_grad_scale(self):
        self.run_steps(adamw=True, grad="fp32", threads=2, grad_scale=1.0 / 1024)

    def test_several_tensors_clipped_like_clip_grad_norm(self):
        # Two tensors, one global norm: as torch.nn.utils.clip_grad_norm_ then AdamW.
        gen = torch.Generator().manual_seed(7)
        ours = [torch.randn(n, generator=gen) for n in (3001, 517)]
        refs = [torch.nn.Parameter(p.clone()) for p in ours]
        opt = torch.optim.AdamW(refs, lr=1e-2)
        moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ours]
        for step in range(1, 11):
            grads = [torch.randn(p.shape, generator=gen) for p in ours]
            found = adamw_(ours, grads, [m for m, _ in moments], [v for _, v in moments],
                           step=step, lr=1e-2, max_grad_norm=1.0, threads=2)
            for r, g in zip(refs, grads):
                r.grad = g.clone()
            norm = torch.nn.utils.clip_grad_norm_(refs, 1.0)
            opt.step()
            self.assertAlmostEqual(found.grad_norm, float(norm), places=3)
        for p, r in zip(ours, refs):
            torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-5)

    def test_skip_nonfinite_writes_nothing(self):
        p, m, v = torch.ones(100), torch.zeros(100), torch.zeros(100)
        g = torch.ones(100)
        g[42] = float("nan")
        found = adamw_([p], [g], [m], [v], step=1, skip_nonfinite=True)
        self.assertTrue(found.skipped)
        self.assertEqual(found.nonfinite, 1)
        self.assertTrue(bool((p == 1).all() and (m == 0).all() and (v == 0).all()))


class Versions(unittest.TestCase):
    def test_counted_with_the_call_this_torch_has(self):
        # torch 2.1 to 2.4 take one tensor a call and raise on a list; 2.5 and later a list
        calls = []

        def one_at_a_time(t):
            if not isinstance(t, torch.Tensor):
                raise TypeError("increment_version expect a Tensor as input")
            calls.append(t)

        a, b = torch.zeros(1), torch.zeros(1)
        with torch.inference_mode():
            c = torch.zeros(1)
        functional._version_bumper(one_at_a_time)([a, b, c])
        self.assertEqual([id(t) for t in calls], [id(a), id(b)])  # none for an inference tensor

        def a_list(ts):
            calls.extend(ts)
        self.assertIs(functional._version_bumper(a_list), a_list)
        self.assertIsNone(functional._version_bumper(None))


class BadInput(unittest.TestCase):
    def test_refused_before_anything_is_written(self):
        p, m, v, g = torch.ones(8), torch.zeros(8), torch.zeros(8), torch.ones(8)
        cases = [
            (dict(params=[p], grads=[g, g]), ValueError, "the same length"),
            (dict(grads=[torch.ones(9)]), ValueError, r"grads\[0\] has 9 elements"),
            (dict(exp_avgs=[torch.zeros(8, dtype=torch.float64)]), TypeError, "exp_avgs"),
            (dict(params=[torch.ones(8, 2).t()], grads=[torch.ones(16)],
                  exp_avgs=[torch.zeros(16)], exp_avg_sqs=[torch.zeros(16)]),
             ValueError, "not contiguous"),
            (dict(step=0), ValueError, "step must be"),
            # ctypes would wrap these without a word: 2**64 + 3 stepped as step 3
            (dict(step=2**64 + 3), ValueError, r"step must be a whole number from 1 to 2\*\*63"),
            (dict(step=[2**63]), ValueError, "step must be"),
            (dict(threads=2**32), ValueError, "threads must be 0"),
            (dict(threads=1025), ValueError, "a count from 1 to 1024"),  # libgomp would crash
            (dict(threads=-1), ValueError, "threads must be 0"),
            (dict(threads=1.5), ValueError, "threads must be 0"),
            (dict(lr="0.1"), TypeError, "lr must be a number"),
            (dict(grads=[torch.ones(8).to(torch.int32)]), TypeError, "grads"),
            # the kernel reads memory, not torch's lazy flags
            (dict(grads=[torch._neg_view(g)]), ValueError, r"grads\[0\] is lazily negated"),
            (dict(grads=[torch._efficientzerotensor(8)]), ValueError, "zeros without memory"),
            # tensors written twice, or read where written: the threads would race on them
            (dict(params=[p, p], grads=[g, g], exp_avgs=[m, torch.zeros(8)],
                  exp_avg_sqs=[v, torch.zeros(8)]), ValueError, r"params\[1\] is the memory"),
            (dict(exp_avg_sqs=[m]), ValueError, r"exp_avg_sqs\[0\] is the memory of exp_avgs"),
            (dict(grads=[p]), ValueError, r"grads\[0\] is the memory of params\[0\]"),
        ]
        for change, error, says in cases:
            kw = dict(params=[p], grads=[g], exp_avgs=[m], exp_avg_sqs=[v], step=1)
            kw.update(change)
            with self.assertRaisesRegex(error, says, msg=str(change)):
                adamw_(**kw)
        # the ranges are the library's, refused as torch's AdamW refuses them (ValueError),
        # numbers are numbers (grad_scale as the others), betas a pair rounded as the kernel does
        for change, error, says in (
                (dict(betas=(0.9, 1.0)), ValueError, r"invalid betas: beta1 and beta2"),
                (dict(lr=-1.0), ValueError, r"invalid learning rate \(lr\): lr must be"),
                (dict(eps=-1e-8), ValueError, r"invalid eps"),
                (dict(betas=(0.9,)), TypeError, r"betas must be a pair of numbers"),
                (dict(betas=(0.9, 0.99999999)), ValueError, r"betas\[1\] = 0.99999999 is 1 in "
                                                            r"float32"),
                (dict(grad_scale="2"), TypeError, r"grad_scale must be a number"),
                (dict(grad_scale=True), TypeError, r"grad_scale must be a number")):
            with self.assertRaisesRegex(error, says, msg=str(change)):
                adamw_([p], [g], [m], [v], step=1, **change)
        self.assertTrue(bool((p == 1).all() and (m == 0).all() and (v == 0).all()))


if __name__ == "__main__":
    unittest.main()
