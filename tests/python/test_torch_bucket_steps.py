"""Buckets stepped during backward (AdamW.step_during_backward()): each bucket is stepped as soon
as its gradients have landed, in the order backward produces them, and step() brings the whole
update in. The result is the whole step's to the bit, also with gradient accumulation, frozen
parameters and parameters without a gradient; skip_nonfinite and max_grad_norm still decide over
every gradient; a gradient changed after backward is an error, and the step stays whole.
Where buckets are cut runs on any torch; the rest skips without post-accumulate-grad hooks
(torch < 2.1)."""

import copy
import unittest
from unittest import mock

import torch

from zenflow_bind import worker

from torch_cases import batches, mlp, ours
from zenflow_bind._layout import MAX_BUCKETS, MAX_GROUPS, RESERVED, bucket_limit, cut_buckets

HAS_HOOKS = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
SMALL = dict(bucket_elements=200)  # the mlp (2516 elements) in 3 buckets


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def run(model, opt, data, streamed, per_step=1, grad_scale=1.0):
    """Train; the last backward of each step inside step_during_backward() when streamed."""
    for i in range(0, len(data), per_step):
        opt.zero_grad()
        chunk = data[i:i + per_step]
        for j, (x, y) in enumerate(chunk):
            if streamed and j == len(chunk) - 1:
                with opt.step_during_backward(grad_scale=grad_scale):
                    (loss_of(model, x, y) / per_step).backward()
            else:
                (loss_of(model, x, y) / per_step).backward()
        opt.step(**({} if streamed else {"grad_scale": grad_scale}))


def equal_params(test, a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        test.assertTrue(torch.equal(p.detach(), q.detach()))


def equal_states(test, a, b):
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    test.assertEqual(sorted(sa), sorted(sb))
    for k in sa:
        for key in sa[k]:
            test.assertTrue(torch.equal(sa[k][key], sb[k][key]), f"{k} {key}")


class Cuts(unittest.TestCase):
    """Where a param group is cut into buckets (any torch)."""

    def test_buckets_are_whole_parameters_in_order(self):
        sizes = [5, 7, 30, 1, 1, 8, 2]
        cuts = cut_buckets(sizes, 10)
        self.assertEqual(cuts, [(0, 2), (2, 3), (3, 6), (6, 7)])  # 12, 30, 10, 2 elements
        self.assertEqual([i for a, b in cuts for i in range(a, b)], list(range(len(sizes))))

    def test_parameters_without_elements_after_a_cut_join_the_last_bucket(self):
        # (FSDP2 leaves a small parameter's shard empty on the last ranks): a bucket of them
        # alone would be a worker group of no element, which the worker refuses
        self.assertEqual(cut_buckets([300, 0, 0], 300), [(0, 3)])
        self.assertEqual(cut_buckets([300, 0, 5], 300), [(0, 1), (1, 3)])
        self.assertEqual(cut_buckets([0, 300], 300), [(0, 2)])
        with ours([torch.nn.Parameter(torch.ones(300)), torch.nn.Parameter(torch.ones(0))],
                  bucket_elements=300) as opt:
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.ones_like(p)
            opt.step()
            self.assertEqual(len(opt._layouts[0].buckets), 1)

    def test_at_most_16_buckets(self):
        sizes = [1000] * 100
        cuts = cut_buckets(sizes, 1)
        self.assertLessEqual(len(cuts), MAX_BUCKETS)
        self.assertEqual(cuts[0][0], 0)
        self.assertEqual(cuts[-1][1], 100)
        self.assertEqual(cut_buckets(sizes, 10**9), [(0, 100)])

    def test_many_large_param_groups_still_fit(self):
        # the worker's groups: the first param groups take up to 16 buckets, and at least
        # RESERVED more param groups fit after any number of large ones
        used, groups = 0, 0
        while used < MAX_GROUPS:
            used += len(cut_buckets([10**9], 1, bucket_limit(used)))
            groups += 1
        self.assertEqual(bucket_limit(0), MAX_BUCKETS)
        self.assertGreaterEqual(groups, RESERVED + 1)
        self.assertEqual(used, MAX_GROUPS)

    def test_bad_bucket_size_and_group_ranges_are_refused(self):
        with self.assertRaisesRegex(ValueError, "bucket_elements"):
            ours(mlp().parameters(), bucket_elements=0)
        with ours(mlp().parameters(), **SMALL) as opt:
            with self.assertRaisesRegex(ValueError, "consecutive"):
                opt.worker.submit(1, groups=range(0, 3, 2))
            with self.assertRaisesRegex(ValueError, "consecutive"):
                opt.worker.submit(1, groups=range(1, 1))
            with self.assertRaises(Exception) as e:
                opt.worker.submit(1, groups=range(2, 5))  # past the 3 registered
            self.assertIn("not registered", str(e.exception))


class OverlapBlock(unittest.TestCase):
    """step_during_backward() in overlap mode (any torch: nothing steps during backward)."""

    def test_overlap_refuses_a_state_read_inside_the_block(self):
        # overlap=True steps nothing during backward, but a step is in flight: reading the
        # state would land it in the weights backward is using (an in-place write autograd
        # then refuses)
        model = mlp()
        data = batches(3)
        with ours(model.parameters(), lr=1e-2, overlap=True) as opt:
            for x, y in data:
                opt.zero_grad()
                with opt.step_during_backward():
                    loss = loss_of(model, x, y)
                    if opt._in_flight is not None:
                        for read in (opt.state_dict, lambda: opt.state):
                            with self.assertRaisesRegex(RuntimeError, "read it before the "
                                                                      "forward pass or after"):
                                read()
                    loss.backward()
                opt.step()
            self.assertIn("state", opt.state_dict())


@unittest.skipUnless(HAS_HOOKS, f"torch {torch.__version__} has no post-accumulate-grad hooks")
class BucketSteps(unittest.TestCase):
    def twins(self, **kwargs):
        a = mlp()
        b = copy.deepcopy(a)
        return a, b, ours(a.parameters(), lr=1e-2, **SMALL, **kwargs), \
            ours(b.parameters(), lr=1e-2, **kwargs)

    def test_buckets_step_during_backward_in_backward_order(self):
        model = mlp()
        x, y = batches(1)[0]
        with ours(model.parameters(), **SMALL) as opt:
            self.assertEqual(len(opt._layouts[0].buckets), 3)
            before = [p.detach().clone() for p in model.parameters()]
            with opt.step_during_backward():
                # before any bucket steps, too: a state brought out now would outlive them
                for read in (opt.state_dict, lambda: opt.state):
                    with self.assertRaisesRegex(RuntimeError, "read it before the block"):
                        read()
                loss_of(model, x, y).backward()
                stream = opt._stream
            with self.assertRaisesRegex(RuntimeError, "between step_during_backward"):
                opt.state_dict()
            # the model is written by step() only, whole
            equal = [torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before)]
            self.assertTrue(all(equal))
            opt.step()
            self.assertFalse(any(torch.equal(p.detach(), q)
                                 for p, q in zip(model.parameters(), before)))
            # every bucket went to the worker as backward produced it, the last layer's first
            # (step() would have stepped the rest itself, in increasing order, and not here)
            first = opt._layouts[0].buckets[0][0].group.index
            self.assertEqual(list(stream.stepped), [first + 2, first + 1, first])

    def test_bit_identical_to_one_step(self):
        for dtype in (torch.float32, torch.bfloat16):
            with self.subTest(dtype=dtype):
                a = mlp(dtype=dtype)
                b = copy.deepcopy(a)
                data = [(x.to(dtype), y.to(dtype)) for x, y in batches(6)]
                with ours(a.parameters(), lr=1e-2, grad_norm=True, **SMALL) as oa, \
                        ours(b.parameters(), lr=1e-2, grad_norm=True) as ob:
                    run(a, oa, data, streamed=True, grad_scale=0.5)
                    run(b, ob, data, streamed=False, grad_scale=0.5)
                    equal_params(self, a, b)
                    equal_states(self, oa, ob)
                    self.assertAlmostEqual(oa.last_grad_norm, ob.last_grad_norm, places=5)

    def test_overlap_steps_as_without_the_block(self):
        # the step in flight stays there until step(): applied when the block began, between
        # forward and backward, it rewrote weights that backward needed (an autograd error)
        a, b, oa, ob = self.twins(overlap=True)
        data = batches(5)
        with oa, ob:
            run(a, oa, data, streamed=True)
            run(b, ob, data, streamed=False)
            oa.synchronize()
            ob.synchronize()
            equal_params(self, a, b)
            equal_states(self, oa, ob)

    def test_accumulation_frozen_and_gradless_parameters(self):
        a, b, oa, ob = self.twins()
        for m in (a, b):
            m[2].weight.requires_grad_(False)  # frozen, in the second bucket
        data = batches(9)
        with oa, ob:
            run(a, oa, data, streamed=True, per_step=3)
            run(b, ob, data, streamed=False, per_step=3)
            equal_params(self, a, b)
            equal_states(self, oa, ob)
        # a parameter backward never reaches (requires_grad, but not in the graph): its bucket
        # waits for step(), which leaves the parameter alone
        a, b, oa, ob = self.twins()
        unused = lambda m: m[4].bias  # noqa: E731

        def partial_loss(m, x, y):
            h = m[3](m[2](m[1](m[0](x))))
            return (h @ m[4].weight.t() - y).square().mean()

        with oa, ob:
            for model, opt, streamed in ((a, oa, True), (b, ob, False)):
                for x, y in batches(3):
                    opt.zero_grad()
                    if streamed:
                        with opt.step_during_backward():
                            partial_loss(model, x, y).backward()
                    else:
                        partial_loss(model, x, y).backward()
                    opt.step()
            equal_params(self, a, b)
            self.assertTrue(torch.equal(unused(a).detach(), unused(mlp()).detach()))

    def test_a_parameter_back_from_idle_steps_in_its_bucket(self):
        # The last layer's bias is out of the graph at steps 2-3 (idle in the worker); at step
        # 4 its bucket waits for step(), which makes it a parameter like the others again, and
        # the result is the unstreamed one's to the bit. The worker is told twice in all (idle,
        # then back), not at every step.
        a, b, oa, ob = self.twins()
        calls = []
        set_ranges = worker.Group.set_ranges

        def counted(group, table):
            calls.append(group.worker is oa.worker)
            return set_ranges(group, table)

        def loss(m, x, y, i):
            if 2 <= i <= 3:
                h = m[3](m[2](m[1](m[0](x))))
                return (h @ m[4].weight.t() - y).square().mean()
            return loss_of(m, x, y)

        with oa, ob, mock.patch.object(worker.Group, "set_ranges", counted):
            for i, (x, y) in enumerate(batches(6)):
                for model, opt, streamed in ((a, oa, True), (b, ob, False)):
                    opt.zero_grad(set_to_none=True)
                    if streamed:
                        with opt.step_during_backward():
                            loss(model, x, y, i).backward()
                    else:
                        loss(model, x, y, i).backward()
                    opt.step()
            equal_params(self, a, b)
            equal_states(self, oa, ob)
        self.assertEqual(calls.count(True), 2)

    def test_skip_and_clip_decide_over_every_bucket(self):
        for kwargs in (dict(skip_nonfinite=True), dict(max_grad_norm=0.05)):
            with self.subTest(**kwargs):
                a, b, oa, ob = self.twins(**kwargs)
                data = batches(4)
                # a NaN in the first layer's gradient at the third step (its own bucket)
                poison = {"on": False}
                a[0].weight.register_hook(lambda g: g.clone().fill_(float("nan"))
                                          if poison["on"] else g)
                b[0].weight.register_hook(lambda g: g.clone().fill_(float("nan"))
                                          if poison["on"] else g)
                with oa, ob:
                    for i, (x, y) in enumerate(data):
                        poison["on"] = "skip_nonfinite" in kwargs and i == 2
                        for model, opt, streamed in ((a, oa, True), (b, ob, False)):
                            before = [p.detach().clone() for p in model.parameters()]
                            opt.zero_grad()
                            if streamed:
                                with opt.step_during_backward():
                                    loss_of(model, x, y).backward()
                                    self.assertFalse(opt._stream)  # nothing goes early
                            else:
                                loss_of(model, x, y).backward()
                            opt.step()
                            if poison["on"]:
                                self.assertTrue(opt.last_step_skipped)
                                equal = [torch.equal(p.detach(), q)
                                         for p, q in zip(model.parameters(), before)]
                                self.assertTrue(all(equal))
                    equal_params(self, a, b)
                    equal_states(self, oa, ob)

    def test_a_gradient_changed_after_backward_is_an_error_and_the_step_whole(self):
        a, b, oa, ob = self.twins()
        x, y = batches(1)[0]
        with oa, ob:
            with oa.step_during_backward():
                loss_of(a, x, y).backward()
            a[4].weight.grad.mul_(0.5)  # clip_grad_norm_ would do this
            with self.assertRaisesRegex(RuntimeError, r"changed after their buckets(.|\n)*"
                                                      r"under DistributedDataParallel call "
                                                      r"register_ddp\(ddp_model\)"):
                oa.step()
            loss_of(b, x, y).backward()
            ob.step()
            equal_params(self, a, b)  # backward's gradients, every bucket
            with self.assertRaisesRegex(ValueError, "give it once"):
                with oa.step_during_backward(grad_scale=0.5):
                    loss_of(a, x, y).backward()
                oa.step(grad_scale=0.25)

    def test_a_model_cast_between_the_block_and_step(self):
        # Module.to() between step_during_backward() and step() (a move to another device, a
        # cast here, with no GPU): the buckets took backward's gradients, so the step completes
        # into the parameters as they are now (not a "gradients changed" error), and the cast,
        # which the worker's buffers cannot follow, is refused after it
        a, b, oa, ob = self.twins()
        x, y = batches(1)[0]
        with oa, ob:
            with oa.step_during_backward():
                loss_of(a, x, y).backward()
            self.assertTrue(oa._stream.stepped)
            a.to(torch.float64)
            with self.assertRaisesRegex(ValueError, "make the optimizer after casting"):
                oa.step()
            loss_of(b, x, y).backward()
            ob.step()
            for p, q in zip(a.parameters(), b.parameters()):
                self.assertTrue(torch.equal(p.detach(), q.detach().double()))

    def test_a_second_backward_in_the_block_is_an_error(self):
        a, b, oa, ob = self.twins()
        x, y = batches(1)[0]
        with oa, ob:
            with oa.step_during_backward():
                loss_of(a, x, y).backward()
                loss_of(a, x, y).backward()  # lands again in buckets already stepping
            with self.assertRaisesRegex(RuntimeError, "changed after their buckets"):
                oa.step()
            oa.zero_grad()
            run(a, oa, batches(2), streamed=True)  # and it goes on

    def test_backward_failing_in_the_block(self):
        # nothing stepped yet: the block leaves nothing behind
        model = mlp()
        x, y = batches(1)[0]
        with ours(model.parameters(), **SMALL) as opt:
            with self.assertRaisesRegex(ValueError, "before backward"):
                with opt.step_during_backward():
                    raise ValueError("before backward")
            run(model, opt, batches(2), streamed=True)
            saved = copy.deepcopy(opt.state_dict())
            before = [p.detach().clone() for p in model.parameters()]

            # after some buckets stepped: step() refuses until a state dict is loaded
            def failing(grad):
                raise RuntimeError("backward failed")

            handle = model[0].weight.register_hook(failing)  # the last layer's buckets went
            with self.assertRaisesRegex(RuntimeError, "backward failed"):
                with opt.step_during_backward():
                    loss_of(model, x, y).backward()
            handle.remove()
            for call in (opt.step, opt.state_dict, opt.step_during_backward().__enter__):
                with self.assertRaisesRegex(RuntimeError, "load_state_dict"):
                    call()
            self.assertTrue(all(torch.equal(p.detach(), q)
                                for p, q in zip(model.parameters(), before)))
            opt.load_state_dict(saved)
            twin = copy.deepcopy(model)
            with ours(twin.parameters(), **SMALL) as ref:
                ref.load_state_dict(saved)
                run(model, opt, batches(2, seed=7), streamed=True)
                run(twin, ref, batches(2, seed=7), streamed=False)
                equal_params(self, model, twin)

    def test_a_worker_killed_during_backward_leaves_the_model(self):
        import os
        import signal
        a = mlp()
        x, y = batches(1)[0]
        with ours(a.parameters(), **SMALL) as opt:
            before = [p.detach().clone() for p in a.parameters()]
            with opt.step_during_backward():
                os.kill(opt.worker.pid, signal.SIGKILL)  # the buckets find it dead
                loss_of(a, x, y).backward()
            with self.assertRaisesRegex(Exception, "nothing of this step was applied"):
                opt.step()
            self.assertTrue(all(torch.equal(p.detach(), q)
                                for p, q in zip(a.parameters(), before)))


if __name__ == "__main__":
    unittest.main()
