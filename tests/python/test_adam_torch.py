"""The zfadam kernels against torch.optim.Adam and torch.optim.AdamW (Debian's python3-torch 1.13).

100 steps on the same parameters and gradients. Tolerance: torch orders its float operations
differently (no FMA, division by sqrt(bias_correction2)), so values differ by a few ulps per step;
after 100 steps we require |ours - torch| <= 1e-5 + 1e-5 * |torch| for params and moments. The bf16
copy-out must equal torch's own round-to-nearest-even of our params, bit for bit.

ZF_ADAM_SHIM names the test-only C shim (CMake sets it)."""

import ctypes
import os
import unittest

import torch

GRAD = {"fp32": 0, "bf16": 1, "fp16": 2}
COPY = {None: 0, "bf16": 1, "fp16": 2}


def load_shim():
    lib = ctypes.CDLL(os.environ["ZF_ADAM_SHIM"])
    f = lib.zf_test_adam_step
    f.restype = ctypes.c_uint64
    f.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int] + \
        [ctypes.c_float] * 5 + [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                                ctypes.c_int]
    return f


class AgainstTorch(unittest.TestCase):
    step_fn = load_shim()

    def run_steps(self, adamw, grad, threads, grad_scale=1.0, copy=None, n=10007, steps=100):
        lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01
        gen = torch.Generator().manual_seed(1234)
        ours = torch.randn(n, generator=gen)
        ref = torch.nn.Parameter(ours.clone())
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        opt = cls([ref], lr=lr, betas=betas, eps=eps, weight_decay=wd)
        m, v = torch.zeros(n), torch.zeros(n)
        out = torch.empty(n, dtype=torch.bfloat16 if copy == "bf16" else torch.float16)
        for step in range(1, steps + 1):
            g = torch.randn(n, generator=gen) * 0.1
            if grad == "bf16":
                g = g.bfloat16()
            scaled = (g.float() / grad_scale).to(g.dtype)  # what a loss-scaled backward gives
            self.assertTrue(torch.equal(scaled.float() * grad_scale, g.float()))
            bad = self.step_fn(ours.data_ptr(), scaled.data_ptr(), m.data_ptr(), v.data_ptr(),
                               out.data_ptr() if copy else None, n, GRAD[grad], COPY[copy],
                               lr, betas[0], betas[1], eps, wd, int(adamw), 1, step, grad_scale,
                               threads)
            self.assertEqual(bad, 0)
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


if __name__ == "__main__":
    unittest.main()
