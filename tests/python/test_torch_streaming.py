"""Gradients streamed into the worker during backward (torch >= 2.1's post-accumulate-grad hooks):
each CPU gradient is copied into the buffer being filled as soon as backward has accumulated it,
and step() does not copy it again. Training still matches torch.optim.AdamW with zero_grad's
default (set_to_none=True), with several backwards per step, with parameters that get no gradient,
and when a gradient is changed in place between backward and step(). Skips on older torch."""

import copy
import unittest

import torch

from torch_cases import assert_close, batches, mlp, ours

HAS_HOOKS = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def shared(tensor, views):
    return any(tensor.data_ptr() == v.data_ptr() for v in views)


@unittest.skipUnless(HAS_HOOKS, f"torch {torch.__version__} has no post-accumulate-grad hooks")
class Streaming(unittest.TestCase):
    def test_backward_puts_each_gradient_in_shared_memory(self):
        model = mlp()
        x, y = batches(1)[0]
        with ours(model.parameters()) as opt:
            slots = [s for l in opt._layouts for s in l.slots]
            for _ in range(3):
                opt.zero_grad()  # torch 2.x: set_to_none=True, backward makes new gradients
                torch.nn.functional.mse_loss(model(x), y).backward()
                # before step(): the hooks already put them in the buffer backward fills
                self.assertTrue(all(shared(s.param.grad, [s.grads[opt._buffer]]) for s in slots))
                opt.step()
        # closed: the hooks are gone, and gradients are private again
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        self.assertFalse(any(shared(s.param.grad, s.grads) for s in slots))

    def test_matches_torch_with_accumulation_and_parameters_without_gradients(self):
        a = mlp()
        b = copy.deepcopy(a)
        data = batches(12)
        frozen = lambda m: m[2]  # noqa: E731 (the middle layer gets no gradient)
        for m in (a, b):
            frozen(m).requires_grad_(False)
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            for i in range(0, len(data), 3):
                for model, o in ((a, opt), (b, ref)):
                    o.zero_grad()
                    for x, y in data[i:i + 3]:  # three backwards per step
                        (torch.nn.functional.mse_loss(model(x), y) / 3).backward()
                    o.step()
            assert_close(self, a.parameters(), b.parameters())
            self.assertTrue(torch.equal(frozen(a).weight, frozen(b).weight))

    def test_a_gradient_changed_after_backward_is_the_one_stepped(self):
        # fp32 and bf16 parameters in one group: fp32 gradients, so the bf16 one's gradient is
        # copied by its hook, not shared; clip_grad_norm_ then scales both in place, and step()
        # must use the scaled values.
        def model():
            torch.manual_seed(0)
            return torch.nn.ModuleDict({"a": torch.nn.Linear(8, 8),
                                        "b": torch.nn.Linear(8, 8).bfloat16()})

        m = model()
        x = torch.randn(4, 8)
        with ours([{"params": list(m.parameters())}], lr=1e-2, weight_decay=0.0) as opt:
            for _ in range(2):
                opt.zero_grad()
                (m["a"](x).square().sum() + m["b"](x.bfloat16()).float().square().sum()).backward()
                before = [p.detach().clone() for p in m.parameters()]
                for p in m.parameters():
                    p.grad.mul_(0)  # in place, after the hooks copied them
                opt.step()
                # zero gradients and zero moments: Adam moves nothing
                for p, q in zip(m.parameters(), before):
                    self.assertTrue(torch.equal(p.detach(), q))


if __name__ == "__main__":
    unittest.main()
