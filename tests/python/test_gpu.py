"""zenflow_bind.optim.AdamW with a model on a CUDA GPU: parity with torch.optim.AdamW over 20
steps, a bit-identical resume from a state dict, steps during backward equal to one step to the
bit with buckets gone back to the GPU during backward, the model untouched when the worker dies
after some had, overlap's update one step later, the worker's buffers pinned and the model's
parameters never staged through a GPU tensor, GradScaler unscaling the copied gradients, a model
moved to the GPU after the optimizer was made (by hand, or by accelerate's prepare()) trained as
one moved before, gradient accumulation over micro-batches stepping their sum, and
DistributedDataParallel's averaged gradients stepped. Skips without a CUDA device (CI has none);
bench/gpu_run.sh runs it on a GPU machine."""

import copy
import importlib.util
import os
import signal
import time
import unittest

import torch

from torch_cases import ours

HAS_CUDA = torch.cuda.is_available()


def gpt(seed=0, dtype=torch.float32, layers=2, width=128):
    """A small decoder-only transformer on the GPU."""
    torch.manual_seed(seed)
    block = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width,
                                             dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(256, width),
                                 "blocks": torch.nn.TransformerEncoder(block, layers),
                                 "head": torch.nn.Linear(width, 256)})
    return model.to("cuda", dtype)


def loss_of(model, tokens):
    mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1] - 1,
                                                                device=tokens.device)
    h = model["blocks"](model["embed"](tokens[:, :-1]), mask=mask, is_causal=True)
    logits = model["head"](h).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))


def data(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (4, 33), generator=g).cuda() for _ in range(steps)]


def count_calls(obj, name):
    """Count the calls of obj.name from now on: a one-element list."""
    calls, method = [0], getattr(obj, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def train(model, opt, batches, during=False):
    for tokens in batches:
        opt.zero_grad()
        if during:
            with opt.step_during_backward():
                loss_of(model, tokens).backward()
        else:
            loss_of(model, tokens).backward()
        opt.step()


@unittest.skipUnless(HAS_CUDA, "no CUDA device")
class Gpu(unittest.TestCase):
    def test_parity_with_torch_over_20_steps(self):
        a = gpt()
        b = copy.deepcopy(a)
        batches = data(20)
        with ours(a.parameters(), lr=1e-3, weight_decay=0.01) as opt:
            self.assertTrue(all(s.master.is_pinned() and s.grads[0].is_pinned()
                                for s in opt._layouts[0].slots))
            train(a, opt, batches)
            torch.cuda.synchronize()
        train(b, torch.optim.AdamW(b.parameters(), lr=1e-3, weight_decay=0.01), batches)
        # Two roundings of the same AdamW differ in the last bits, and training feeds that back:
        # where a gradient is near zero, m / (sqrt(v) + eps) turns on it. 20 steps move a weight
        # up to 20 lr; the two may differ by half of one step's lr, not more.
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-3, atol=5e-4)

    def test_resume_is_bit_identical(self):
        batches = data(12)
        a = gpt(dtype=torch.bfloat16)
        with ours(a.parameters(), lr=1e-3) as opt:
            train(a, opt, batches[:6])
            saved = copy.deepcopy(opt.state_dict()), copy.deepcopy(a.state_dict())
            train(a, opt, batches[6:])
        b = gpt(seed=5, dtype=torch.bfloat16)
        b.load_state_dict(saved[1])
        with ours(b.parameters(), lr=1e-3) as opt:
            opt.load_state_dict(saved[0])
            train(b, opt, batches[6:])
        for p, q in zip(a.parameters(), b.parameters()):
            self.assertTrue(torch.equal(p, q))

    def test_steps_during_backward_equal_one_step(self):
        a = gpt(dtype=torch.bfloat16)
        b = copy.deepcopy(a)
        batches = data(6)
        with ours(a.parameters(), lr=1e-3, bucket_elements=50_000) as oa, \
                ours(b.parameters(), lr=1e-3) as ob:
            self.assertGreater(len(oa._layouts[0].buckets), 2)
            early = count_calls(oa._gpu, "early")
            train(a, oa, batches, during=True)
            train(b, ob, batches)
            torch.cuda.synchronize()
            self.assertGreaterEqual(early[0], len(batches))  # buckets went back during backward
            for p, q in zip(a.parameters(), b.parameters()):
                self.assertTrue(torch.equal(p, q))

    def test_distributed_data_parallel_steps_the_averaged_gradients(self):
        # the hook queues each gradient's copy as backward produces it; DDP then averages it in
        # place, on its own stream (two gloo ranks sharing this GPU)
        from test_torch_ddp import run_parity
        run_parity(self, "cuda")

    def test_register_ddp_takes_each_reduced_gradient_once(self):
        # each bucket's average leaves the GPU as DDP's reduction completes (its future's
        # callback, on streams that wait for the reduction), once, and the buckets step and go
        # back during backward
        from test_torch_ddp import run_awkward, run_registered
        run_registered(self, "cuda")
        run_awkward(self, "cuda")

    def test_gradient_accumulation_steps_the_sum(self):
        # micro-batches accumulate into .grad before one step: the hook copies each partial sum
        # as it lands, and the step must take the last (with the last backward in
        # step_during_backward() too). One step of Adam moves each weight by about lr times the
        # sign of its gradient: a partial sum stepped would be off by up to 2 lr where its sign
        # is not the sum's; two roundings of one AdamW differ by far less (test_parity's bound)
        micro = data(12, seed=4)
        for during in (False, True):
            a = gpt()
            b = copy.deepcopy(a)
            with ours(a.parameters(), lr=1e-3, bucket_elements=50_000) as opt:
                ref = torch.optim.AdamW(b.parameters(), lr=1e-3)
                for step in range(3):
                    batches = micro[4 * step:4 * step + 4]
                    for model, o in ((a, opt), (b, ref)):
                        o.zero_grad()
                        for tokens in batches[:-1]:
                            (loss_of(model, tokens) / 4).backward()
                        if during and o is opt:
                            with opt.step_during_backward():
                                (loss_of(model, batches[-1]) / 4).backward()
                        else:
                            (loss_of(model, batches[-1]) / 4).backward()
                        o.step()
                torch.cuda.synchronize()
            for p, q in zip(a.parameters(), b.parameters()):
                torch.testing.assert_close(p, q, rtol=0, atol=5e-4,
                                           msg=f"steps during backward: {during}")

    @unittest.skipUnless(hasattr(getattr(torch, "amp", None), "GradScaler"), "torch < 2.3")
    def test_grad_scaler_unscales_the_copied_gradients(self):
        """The hooks copy CUDA gradients to the host during backward, before the scaler sees
        them: it hands its scale to the kernel instead of unscaling them in place. fp32
        parameters, as GradScaler's users have (torch cannot unscale bf16 CUDA gradients, for its
        own optimizers either): a power-of-2 scale is exact, so the scaled runs equal the plain
        one to the bit."""
        batches = data(5)
        plain = gpt()
        runs = [copy.deepcopy(plain), copy.deepcopy(plain)]
        with ours(plain.parameters(), lr=1e-3) as opt:
            train(plain, opt, batches)
        for model, during in zip(runs, (False, True)):
            scaler = torch.amp.GradScaler("cuda", init_scale=4096.0)
            with ours(model.parameters(), lr=1e-3, bucket_elements=50_000) as opt:
                for tokens in batches:
                    opt.zero_grad()
                    if during:
                        with opt.step_during_backward(grad_scale=1 / scaler.get_scale()):
                            scaler.scale(loss_of(model, tokens)).backward()
                    else:
                        scaler.scale(loss_of(model, tokens)).backward()
                    scaler.step(opt)
                    scaler.update()
                    self.assertFalse(opt.last_step_skipped)
            torch.cuda.synchronize()
            for p, q in zip(model.parameters(), plain.parameters()):
                self.assertTrue(torch.equal(p, q), f"steps during backward: {during}")

    def test_worker_killed_after_buckets_went_back_leaves_the_model(self):
        model = gpt(dtype=torch.bfloat16)
        armed, slots = [False], []

        def kill_once_some_went_back(p):  # the embedding's: the last gradient of backward
            if not armed[0]:
                return
            deadline = time.monotonic() + 30
            while not any(s.early is not None for s in slots) and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(opt.worker.pid, signal.SIGKILL)  # before its bucket goes (hooks in order)

        model["embed"].weight.register_post_accumulate_grad_hook(kill_once_some_went_back)
        with ours(model.parameters(), lr=1e-3, bucket_elements=50_000) as opt:
            slots += opt._layouts[0].slots
            train(model, opt, data(2), during=True)
            torch.cuda.synchronize()
            before = [p.detach().clone() for p in model.parameters()]
            armed[0] = True
            opt.zero_grad()
            with opt.step_during_backward():
                loss_of(model, data(1, seed=3)[0]).backward()
            self.assertTrue(any(s.early is not None for s in slots))
            with self.assertRaisesRegex(Exception, "nothing of this step was applied"):
                opt.step()
            self.assertTrue(all(s.early is None for s in slots))
            for p, q in zip(model.parameters(), before):
                self.assertTrue(torch.equal(p, q))

    def test_overlap_lands_one_step_later(self):
        # the same gradients in both modes: after step() k the overlapped model holds the
        # blocking one's weights after k - 1 steps, after synchronize() those after k
        gen = torch.Generator().manual_seed(9)
        blocking = gpt(dtype=torch.bfloat16)
        overlapped = copy.deepcopy(blocking)
        grads = [[torch.randn(p.shape, generator=gen).to("cuda", p.dtype)
                  for p in blocking.parameters()] for _ in range(5)]
        history = [[p.detach().clone() for p in blocking.parameters()]]
        with ours(blocking.parameters(), lr=1e-3) as opt:
            for gs in grads:
                for p, g in zip(blocking.parameters(), gs):
                    p.grad = g.clone()
                opt.step()
                history.append([p.detach().clone() for p in blocking.parameters()])
        with ours(overlapped.parameters(), lr=1e-3, overlap=True) as opt:
            for k, gs in enumerate(grads, 1):
                for p, g in zip(overlapped.parameters(), gs):
                    p.grad = g.clone()
                opt.step()
                for p, q in zip(overlapped.parameters(), history[k - 1]):
                    self.assertTrue(torch.equal(p, q))
            opt.synchronize()
            for p, q in zip(overlapped.parameters(), history[-1]):
                self.assertTrue(torch.equal(p, q))

    def test_a_model_moved_to_the_gpu_after_the_optimizer_trains_there(self):
        # Module.cuda() keeps the Parameter objects, and the Hugging Face Trainer and
        # accelerate's prepare() move the model they are given after the user made the
        # optimizer: the worker's optimizer follows, as if made after the move (its buffers
        # pinned, the hooks copying CUDA gradients); the in-process kernel reads host memory
        # and refuses
        batches = data(4)
        for during in (False, True):
            moved = gpt(dtype=torch.bfloat16).cpu()
            placed = copy.deepcopy(moved).cuda()
            with ours(moved.parameters(), lr=1e-3, bucket_elements=50_000) as a, \
                    ours(placed.parameters(), lr=1e-3, bucket_elements=50_000) as b:
                moved.cuda()
                train(moved, a, batches, during=during)
                train(placed, b, batches, during=during)
                torch.cuda.synchronize()
                self.assertTrue(all(s.master.is_pinned() and s.streamable()
                                    for s in a._layouts[0].slots))
            for p, q in zip(moved.parameters(), placed.parameters()):
                self.assertTrue(torch.equal(p, q), f"steps during backward: {during}")
        model = gpt().cpu()
        with ours(model.parameters(), lr=1e-3, worker=False) as opt:
            model.cuda()
            with self.assertRaisesRegex(ValueError, "after moving"):
                train(model, opt, data(1))

    @unittest.skipIf(importlib.util.find_spec("accelerate") is None,
                     "accelerate is not installed")
    def test_accelerate_prepare_of_a_model_made_on_the_cpu(self):
        from accelerate import Accelerator
        batches = data(4)
        model = gpt().cpu()
        placed = copy.deepcopy(model).cuda()
        accelerator = Accelerator()
        with ours(model.parameters(), lr=1e-3) as opt, ours(placed.parameters(), lr=1e-3) as ref:
            model, wrapped = accelerator.prepare(model, opt)  # moves the model, loads opt's state
            self.assertEqual(next(model.parameters()).device.type, "cuda")
            for tokens in batches:
                wrapped.zero_grad()
                accelerator.backward(loss_of(model, tokens))
                wrapped.step()
            train(placed, ref, batches)
            torch.cuda.synchronize()
        for p, q in zip(model.parameters(), placed.parameters()):
            self.assertTrue(torch.equal(p, q))

    def test_copy_back_needs_no_gpu_staging(self):
        # bf16 model, bf16 copy-out: each parameter's copy goes straight into its storage, so
        # the GPU's memory does not grow during step()
        model = gpt(dtype=torch.bfloat16, layers=4, width=256)
        with ours(model.parameters(), lr=1e-3) as opt:
            train(model, opt, data(2))
            torch.cuda.synchronize()
            loss_of(model, data(1)[0]).backward()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            opt.step()
            torch.cuda.synchronize()
            self.assertLessEqual(torch.cuda.max_memory_allocated() - before, 0)


if __name__ == "__main__":
    unittest.main()
