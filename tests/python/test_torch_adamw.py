"""zenflow_bind.optim.AdamW against torch.optim.AdamW (Debian's torch): the math of every group,
schedulers, late groups, parameters without gradients. Tolerance: the worker's kernel orders its
float operations differently (FMA), a few ulps per step; after 50 steps rtol = atol = 1e-5."""

import collections
import contextlib
import os
import unittest
from unittest import mock

import torch

from zenflow_bind import worker
from zenflow_bind._native import MAX_GROUPS

from torch_cases import assert_close, batches, groups_of, ours, train, twins


class Parity(unittest.TestCase):
    def test_a_hand_written_zero_grad_that_detaches_each_gradient(self):
        # fastai's Optimizer.zero_grad and many SAM implementations: detach_() then zero_()
        # each .grad, which torch refuses for a view (each .grad is a slice of the worker's
        # gradient buffer after the first step)
        a, b = twins()
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            for x, y in batches(3):
                for model, o in ((a, opt), (b, ref)):
                    for p in model.parameters():
                        if p.grad is not None:
                            p.grad.detach_()
                            p.grad.zero_()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    o.step()
            assert_close(self, a.parameters(), b.parameters())

    def test_groups_with_their_own_hyperparameters(self):
        a, b = twins()
        data = batches(50)
        with ours(groups_of(a), lr=1e-2, betas=(0.8, 0.99), eps=1e-7) as opt:
            train(a, opt, data)
            train(b, torch.optim.AdamW(groups_of(b), lr=1e-2, betas=(0.8, 0.99), eps=1e-7),
                  data)
            assert_close(self, a.parameters(), b.parameters())
            moved = sum((p - q).abs().sum() for p, q in zip(a.parameters(), twins()[0].parameters()))
            self.assertGreater(float(moved), 1.0)  # it trained: equality is not "nothing moved"

    def test_adam_mode_is_torch_adam(self):
        a, b = twins()
        data = batches(30)
        with ours(a.parameters(), lr=1e-2, weight_decay=0.05, adamw_mode=False) as opt:
            train(a, opt, data)
        train(b, torch.optim.Adam(b.parameters(), lr=1e-2, weight_decay=0.05), data)
        assert_close(self, a.parameters(), b.parameters())

    def test_maximize(self):
        a, b = twins()
        data = batches(20)
        with ours(a.parameters(), lr=1e-2, maximize=True) as opt:
            train(a, opt, data)
        train(b, torch.optim.AdamW(b.parameters(), lr=1e-2, maximize=True), data)
        assert_close(self, a.parameters(), b.parameters())

    def test_gradients_reseated_through_data(self):
        # Gradient masking and compression code writes p.grad.data = f(p.grad) after backward.
        # A CPU gradient lives in the worker's shared buffer: the re-seat must reach the step as
        # the same edit in place does, and later steps must still see backward's gradients
        # (once, it cut the worker off from that gradient for good: 0.67 from torch in 5 steps).
        def run(make, edit, reseat):
            a = twins()[0]
            opt = make(a.parameters())
            for i, (x, y) in enumerate(batches(6)):
                opt.zero_grad(set_to_none=i % 2 == 0)
                torch.nn.functional.mse_loss(a(x), y).backward()
                if i in (1, 3):
                    for p in a.parameters():
                        if reseat:
                            p.grad.data = edit(p.grad.data)
                        else:
                            p.grad.copy_(edit(p.grad))
                opt.step()
            if hasattr(opt, "synchronize"):
                opt.synchronize()
                opt.close()
            return [p.detach() for p in a.parameters()]

        for name, edit in (("same values", torch.clone), ("masked", lambda g: g * (g > 0))):
            torch_run = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2), edit, True)
            for kw in (dict(), dict(overlap=True)):  # (overlap: one step behind torch's)
                with self.subTest(name, **kw):
                    got = run(lambda ps: ours(ps, lr=1e-2, **kw), edit, True)
                    in_place = run(lambda ps: ours(ps, lr=1e-2, **kw), edit, False)
                    for p, q in zip(got, in_place):
                        self.assertTrue(torch.equal(p, q))
                    if not kw:
                        assert_close(self, got, torch_run)

    def test_closure(self):
        a, b = twins()
        x, y = batches(1)[0]
        losses = []
        for model, opt in ((a, ours(a.parameters(), lr=1e-2)),
                           (b, torch.optim.AdamW(b.parameters(), lr=1e-2))):
            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            losses.append([float(opt.step(closure)) for _ in range(5)])
        self.assertEqual(losses[0][0], losses[1][0])
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
        assert_close(self, a.parameters(), b.parameters())

    def test_scheduler_changes_the_applied_lr(self):
        a, b = twins()
        data = batches(30)
        opt_a = ours(groups_of(a), lr=3e-2)
        opt_b = torch.optim.AdamW(groups_of(b), lr=3e-2)
        sched = torch.optim.lr_scheduler.StepLR
        train(a, opt_a, data, sched(opt_a, step_size=4, gamma=0.3))
        train(b, opt_b, data, sched(opt_b, step_size=4, gamma=0.3))
        self.assertAlmostEqual(opt_a.param_groups[0]["lr"], 3e-2 * 0.3 ** 7)
        assert_close(self, a.parameters(), b.parameters())
        opt_a.close()

    def test_stochastic_weight_averaging(self):
        # torch.optim.swa_utils as its docs use it: AdamW, then SWALR and an AveragedModel
        # updated after each step from the second half on. In overlap mode the average reads
        # the model after synchronize(), as any reader of the parameters must.
        from torch.optim.swa_utils import SWALR, AveragedModel
        data = batches(12)
        for overlap in (False, True):
            a, b = twins()
            runs = []
            for model, opt in ((a, ours(a.parameters(), lr=1e-2, overlap=overlap)),
                               (b, torch.optim.AdamW(b.parameters(), lr=1e-2))):
                swa_model, swa = AveragedModel(model), SWALR(opt, swa_lr=5e-3, anneal_epochs=3)
                for i, (x, y) in enumerate(data):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                    if i >= 6:
                        if overlap and model is a:
                            opt.synchronize()
                        swa_model.update_parameters(model)
                        swa.step()
                if model is a:
                    opt.close()
                runs.append(swa_model)
                self.assertAlmostEqual(opt.param_groups[0]["lr"], 5e-3)
            self.assertEqual(int(runs[0].n_averaged), 6)
            if not overlap:  # overlap computes each gradient one step stale: another run
                assert_close(self, runs[0].parameters(), runs[1].parameters())
                assert_close(self, a.parameters(), b.parameters())
            else:
                self.assertFalse(torch.equal(next(runs[0].parameters()),
                                             next(a.parameters())))

    def test_late_group_bias_correction(self):
        # torch counts steps per parameter: a group added after 10 steps starts at step 1.
        a, b = twins()
        data = batches(16)
        late_a, late_b = list(a[4].parameters()), list(b[4].parameters())
        opt_a = ours([p for m in (a[0], a[2]) for p in m.parameters()], lr=1e-2)
        opt_b = torch.optim.AdamW([p for m in (b[0], b[2]) for p in m.parameters()], lr=1e-2)
        for model, opt in ((a, opt_a), (b, opt_b)):
            train(model, opt, data[:10])
        opt_a.add_param_group({"params": late_a, "lr": 5e-2})
        opt_b.add_param_group({"params": late_b, "lr": 5e-2})
        for model, opt in ((a, opt_a), (b, opt_b)):
            train(model, opt, data[10:])
        assert_close(self, a.parameters(), b.parameters())
        self.assertEqual(float(opt_a.state_dict()["state"][4]["step"]), 6.0)
        opt_a.close()

    def test_param_groups_edited_in_place_are_refused(self):
        # torch's optimizers follow param_groups edited in place; the worker holds each group's
        # parameters as add_param_group() gave them, paired with the groups by position (a
        # removed group's lr went to the next one, an appended parameter never stepped)
        a = twins()[0]
        data = batches(3)
        edits = {"a group removed": lambda gs: gs.pop(0),
                 "a parameter appended": lambda gs: gs[1]["params"].append(a[4].weight),
                 "a parameter removed": lambda gs: gs[0]["params"].pop(),
                 "a parameter replaced":
                     lambda gs: gs[1]["params"].__setitem__(0, a[0].weight)}
        with ours(groups_of(a), lr=1e-2) as opt:
            train(a, opt, data[:1])
            for what, edit in edits.items():
                with self.subTest(what):
                    saved = [(g, list(g["params"])) for g in opt.param_groups]
                    before = [p.detach().clone() for p in a.parameters()]
                    edit(opt.param_groups)
                    for call in (lambda: train(a, opt, data[1:2]), opt.state_dict):
                        with self.assertRaisesRegex(ValueError, "edited in place"):
                            call()
                    self.assertTrue(all(torch.equal(p.detach(), q)
                                        for p, q in zip(a.parameters(), before)))
                    opt.param_groups[:] = [g for g, _ in saved]  # as they were: steps again
                    for g, params in saved:
                        g["params"][:] = params
                    train(a, opt, data[1:2])

    def test_a_param_group_past_the_workers_groups_is_refused_clearly(self):
        # one worker group each (layer-wise learning rates, a param group per parameter): the
        # last does not fit, says so and what to do, and leaves the optimizer as it was; empty
        # groups take no worker group; the trainer holds one fd for all their memory
        n = MAX_GROUPS
        params = [torch.nn.Parameter(torch.randn(4)) for _ in range(n + 1)]
        groups = [{"params": [p], "lr": 1e-3 * (1 + i / n)} for i, p in enumerate(params)]
        fds = len(os.listdir("/proc/self/fd"))
        with ours(groups[:n]) as opt:
            self.assertLessEqual(len(os.listdir("/proc/self/fd")), fds + 4)  # socket, pidfd, 2
            opt.add_param_group({"params": [], "lr": 1e-3})
            with self.assertRaisesRegex(ValueError, f"param group {n + 1} does not fit: the "
                                                    f"worker's {n} groups are taken.*worker=False"):
                opt.add_param_group(groups[n])
            self.assertEqual(len(opt.param_groups), n + 1)
            mirror = [torch.nn.Parameter(p.detach().clone()) for p in params[:n]]
            ref = torch.optim.AdamW([{"params": [q], "lr": g["lr"]}
                                     for q, g in zip(mirror, groups)])
            for p, q in zip(params[:n], mirror):  # each group its own lr, as torch's
                p.grad, q.grad = torch.ones(4), torch.ones(4)
            opt.step()
            ref.step()
            assert_close(self, params[:n], mirror)
            self.assertEqual(float(opt.state[params[n - 1]]["step"]), 1.0)


def step_pairs(pairs, x, y, without=None):
    """One step of each (model, optimizer) pair on (x, y); the parameters without(model) names
    have no gradient at it (.grad None, as torch's zero_grad() leaves an unused one)."""
    for model, opt in pairs:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in without(model) if without else ():
            p.grad = None
        opt.step()


class WithoutGrad(unittest.TestCase):
    def test_parameters_without_grad_are_left_alone(self):
        # Layer 4's weight, a group of its own, is frozen for 8 steps, then trained: torch starts
        # its bias correction then. Layer 2's bias has state and then loses its gradient for
        # good: torch neither decays nor moves it, nor its moments.
        a, b = twins()
        data = batches(12)
        for m in (a, b):
            m[4].weight.requires_grad_(False)
        frozen_before = a[4].weight.detach().clone()
        groups = lambda m: [{"params": [p for p in m.parameters() if p is not m[4].weight]},
                            {"params": [m[4].weight], "weight_decay": 0.3}]
        opt_a = ours(groups(a), lr=1e-2, weight_decay=0.5)
        opt_b = torch.optim.AdamW(groups(b), lr=1e-2, weight_decay=0.5)
        for i, (x, y) in enumerate(data):
            if i == 8:
                self.assertTrue(torch.equal(a[4].weight, frozen_before))
                self.assertNotIn(5, opt_a.state_dict()["state"])  # no state for it
                for m in (a, b):
                    m[4].weight.requires_grad_(True)
            step_pairs(((a, opt_a), (b, opt_b)), x, y,
                       lambda m: [m[2].bias] if i >= 4 else [])
        assert_close(self, a.parameters(), b.parameters())
        state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
        self.assertEqual(sorted(state_a), sorted(state_b))
        self.assertEqual(float(state_a[3]["step"]), 4.0)  # layer 2's bias stopped at 4
        self.assertEqual(float(state_a[5]["step"]), 4.0)  # layer 4's weight started at 8
        for i in state_a:
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(state_a[i][key], state_b[i][key], rtol=1e-5,
                                           atol=1e-6)
        opt_a.close()

    def test_parameters_that_missed_steps_keep_their_own_bias_correction(self):
        # torch counts steps per parameter. In one group with the others, layer 2's bias has no
        # gradient at steps 3-6 and goes on after; layer 4's weight is frozen for the first 5
        # steps. Each is bias-corrected by its own count, not the group's; so again after a
        # state dict with such counts is loaded (here torch's, into a fresh optimizer).
        a, b = twins()
        for m in (a, b):
            m[4].weight.requires_grad_(False)
        opt_a = ours(a.parameters(), lr=1e-2, weight_decay=0.1)
        opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
        for i, (x, y) in enumerate(batches(14)):
            if i == 5:
                for m in (a, b):
                    m[4].weight.requires_grad_(True)
            step_pairs(((a, opt_a), (b, opt_b)), x, y,
                       lambda m: [m[2].bias] if 2 <= i <= 5 else [])
        assert_close(self, a.parameters(), b.parameters())
        index = {id(p): i for i, p in enumerate(a.parameters())}
        state_a = opt_a.state_dict()["state"]
        self.assertEqual(float(state_a[index[id(a[2].bias)]]["step"]), 10.0)
        self.assertEqual(float(state_a[index[id(a[4].weight)]]["step"]), 9.0)
        self.assertEqual(float(state_a[index[id(a[0].weight)]]["step"]), 14.0)
        opt_a.close()
        c, _ = twins()
        c.load_state_dict(b.state_dict())
        opt_c = ours(c.parameters(), lr=1e-2, weight_decay=0.1)
        opt_c.load_state_dict(opt_b.state_dict())
        for model, opt in ((b, opt_b), (c, opt_c)):
            train(model, opt, batches(3, seed=5))
        assert_close(self, c.parameters(), b.parameters())
        opt_c.close()

    def test_parameters_without_grad_cost_no_state_transfer(self):
        # The worker leaves them alone (idle ranges): no copy of the group's moments out and back
        # in those steps, and the ranges are sent only when the set of idle parameters changes
        # (the bias goes idle at step 3, comes back at step 7).
        a, b = twins()
        opt_a = ours(a.parameters(), lr=1e-2, weight_decay=0.1)
        opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
        calls = collections.Counter()

        def counted(name):
            original = getattr(worker.Group, name)

            def call(*args, **kwargs):
                calls[name] += 1
                return original(*args, **kwargs)
            return call
        with contextlib.ExitStack() as patches:
            for name in ("get_state", "take_state", "set_state", "set_ranges"):
                patches.enter_context(mock.patch.object(worker.Group, name, counted(name)))
            for i, (x, y) in enumerate(batches(10)):
                step_pairs(((a, opt_a), (b, opt_b)), x, y,
                           lambda m: [m[2].bias] if 2 <= i <= 5 else [])
        self.assertEqual(calls["get_state"] + calls["take_state"] + calls["set_state"], 0)
        self.assertEqual(calls["set_ranges"], 2)
        assert_close(self, a.parameters(), b.parameters())
        opt_a.close()

    def test_adam_l2_leaves_parameters_without_grad_alone(self):
        # With Adam's L2 term (adamw_mode=False) a zero gradient is not zero once the decay is
        # added: a frozen parameter must keep its weights and get no moments in the worker.
        a, b = twins()
        for m in (a, b):
            m[4].weight.requires_grad_(False)
        frozen = a[4].weight.detach().clone()
        data = batches(6)
        opt_a = ours(a.parameters(), lr=1e-2, weight_decay=0.1, adamw_mode=False)
        opt_b = torch.optim.Adam(b.parameters(), lr=1e-2, weight_decay=0.1)
        for x, y in data:
            for model, opt in ((a, opt_a), (b, opt_b)):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        assert_close(self, a.parameters(), b.parameters())
        self.assertTrue(torch.equal(a[4].weight, frozen))
        slot = next(s for s in opt_a._layouts[0].slots if s.param is a[4].weight)
        m, v, _ = slot.group.take_state()
        cut = slice(slot.at, slot.at + slot.numel)
        self.assertEqual(float(abs(m[cut]).sum() + abs(v[cut]).sum()), 0.0)
        frozen_index = [p is a[4].weight for p in a.parameters()].index(True)
        self.assertNotIn(frozen_index, opt_a.state_dict()["state"])
        opt_a.close()

    def test_no_gradient_at_all_is_no_step(self):
        a, _ = twins()
        before = [p.detach().clone() for p in a.parameters()]
        with ours(a.parameters(), lr=1e-2, weight_decay=0.5) as opt:
            opt.step()
            self.assertEqual(opt.last_step_seconds, 0.0)  # not even a round trip to the worker
            self.assertEqual(opt.state_dict()["state"], {})
        for p, q in zip(a.parameters(), before):
            self.assertTrue(torch.equal(p, q))


if __name__ == "__main__":
    unittest.main()
