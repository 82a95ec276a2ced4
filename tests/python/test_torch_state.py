"""zenflow_bind.optim.AdamW's state: torch's state dict format both ways with torch.optim.AdamW,
checkpoints through torch.save/torch.load into a new optimizer (a new worker), the overflow skip
that writes nothing, and clipping by the global norm."""

import inspect
import io
import os
import tempfile
import unittest

import torch

from torch_cases import (assert_close, assert_equal, batches, groups_of, mapped, mlp, ours, train,
                         twins)
import zenflow_bind.optim


def moved_state(opt):
    return {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}


def edited_alike(edit):
    """torch's AdamW on one mlp() and ours on another, each given edit(model, optimizer): (the
    model, torch's, ours, our optimizer), which the caller closes."""
    ref, a = mlp(), mlp()
    theirs = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = ours(a.parameters(), lr=1e-2)
    for model, o in ((ref, theirs), (a, opt)):
        edit(model, o)
    return ref, theirs, a, opt


def resumes_as_torch(test, saved, model_saved, ref, theirs, rest):
    """A new model and optimizer loaded from (model_saved, saved) train on rest as torch's AdamW
    (theirs, on ref) goes on; the new optimizer's state dict after."""
    resumed = mlp(seed=5)
    resumed.load_state_dict(model_saved)
    with ours(resumed.parameters(), lr=1e-2) as opt:
        opt.load_state_dict(saved)
        train(resumed, opt, rest)
        after = opt.state_dict()
    train(ref, theirs, rest)
    assert_close(test, list(resumed.parameters()), list(ref.parameters()))
    return after


class StateDict(unittest.TestCase):
    def test_moves_both_ways_with_torch(self):
        data = batches(20)
        ref, a, b = mlp(), mlp(), mlp()
        train(ref, torch.optim.AdamW(groups_of(ref), lr=1e-2), data)

        # ours for 10 steps, then torch.optim.AdamW from our state dict
        with ours(groups_of(a), lr=1e-2) as opt:
            train(a, opt, data[:10])
            sd = opt.state_dict()
        self.assertIsInstance(sd["state"][0]["step"], torch.Tensor)  # as torch 1.13 stores it
        opt = torch.optim.AdamW(groups_of(a), lr=1e-2)
        opt.load_state_dict(sd)
        train(a, opt, data[10:])
        assert_close(self, a.parameters(), ref.parameters())

        # torch.optim.AdamW for 10 steps, then ours from its state dict
        opt = torch.optim.AdamW(groups_of(b), lr=1e-2)
        train(b, opt, data[:10])
        sd = opt.state_dict()
        with ours(groups_of(b), lr=5e-4) as opt:  # lr comes from the state dict's groups
            opt.load_state_dict(sd)
            self.assertEqual(opt.param_groups[0]["lr"], 1e-2)
            train(b, opt, data[10:])
            assert_close(self, b.parameters(), ref.parameters())

    def test_groups_hold_exactly_the_keys_of_this_torchs_adamw(self):
        # live and saved, in both modes (torch 1.13's AdamW has no fused nor differentiable:
        # they were added there)
        want = set(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).param_groups[0])
        for worker in (True, False):
            with self.subTest(worker=worker), \
                    zenflow_bind.optim.AdamW(mlp().parameters(), threads=1,
                                             worker=worker) as opt:
                self.assertEqual(set(opt.param_groups[0]), want)
                self.assertEqual(set(opt.state_dict()["param_groups"][0]), want)

    def test_checkpoint_resume_in_a_new_worker_is_bit_identical(self):
        # Loaded from bytes, and from a file mapped by torch.load(mmap=True) (torch >= 2.1), whose
        # pages the load reads as it writes them into the worker.
        ways = ["bytes"] + (["mmap"] if "mmap" in inspect.signature(torch.load).parameters
                            else [])
        for way in ways:
            with self.subTest(way), tempfile.TemporaryDirectory() as tmp:
                self._resume(way, os.path.join(tmp, "ckpt.pt"))

    def _resume(self, way, path):
        data = batches(20)
        straight, resumed = mlp(), mlp()
        with ours(groups_of(straight), lr=1e-2) as opt:
            sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
            train(straight, opt, data, sched)
            want = moved_state(opt)

        opt = ours(groups_of(resumed), lr=1e-2)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        train(resumed, opt, data[:10], sched)
        blob = io.BytesIO() if way == "bytes" else path
        torch.save({"model": resumed.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict()}, blob)
        first_pid = opt.worker.pid
        opt.close()

        if way == "bytes":
            blob.seek(0)
            ckpt = torch.load(blob)
        else:
            ckpt = torch.load(path, mmap=True)
        model = mlp(seed=7)  # other weights: all must come from the checkpoint
        model.load_state_dict(ckpt["model"])
        with ours(groups_of(model), lr=1.0) as opt:
            self.assertNotEqual(opt.worker.pid, first_pid)
            sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
            opt.load_state_dict(ckpt["opt"])
            sched.load_state_dict(ckpt["sched"])
            train(model, opt, data[10:], sched)
            assert_equal(self, model.parameters(), straight.parameters())
            got = moved_state(opt)
        self.assertEqual(sorted(got), sorted(want))
        for i in want:
            assert_equal(self, [got[i][k] for k in sorted(want[i])],
                         [want[i][k] for k in sorted(want[i])])

    def test_a_state_dict_holds_the_moments_until_dropped(self):
        # The moments come out of the worker into memory of their own, one piece per bucket,
        # that the state dict's tensors view: gone once neither the optimizer (until its next
        # step) nor the caller holds them, and what they hold outlives the optimizer.
        data, model = batches(3), mlp()
        opt = ours(groups_of(model), lr=1e-2, bucket_elements=300)
        train(model, opt, data[:2])
        self.assertGreater(sum(len(layout.buckets) for layout in opt._layouts), 2)
        sd = opt.state_dict()
        memory = [s[k].data_ptr() for s in sd["state"].values() for k in ("exp_avg", "exp_avg_sq")]
        want = {i: s["exp_avg_sq"].clone() for i, s in sd["state"].items()}
        train(model, opt, data[2:])
        self.assertEqual(mapped(memory), len(memory))  # the caller's sd still views them
        opt.close()
        for i, s in sd["state"].items():
            self.assertTrue(torch.equal(s["exp_avg_sq"], want[i]))
        del s, sd
        self.assertEqual(mapped(memory), 0)

    def test_moments_of_any_layout_load(self):
        # Saved moments that are strided views (a column of a stacked tensor) or fp64 go
        # to the worker as their values, whatever the bucket they fall in.
        data, model = batches(3), mlp()
        opt = ours(groups_of(model), lr=1e-2, bucket_elements=300)
        train(model, opt, data[:2])
        sd = opt.state_dict()
        want = {i: {k: s[k].clone() for k in ("exp_avg", "exp_avg_sq")}
                for i, s in sd["state"].items()}
        for i, s in sd["state"].items():
            s["exp_avg"] = torch.stack([s["exp_avg"], -s["exp_avg"]], -1)[..., 0]
            s["exp_avg_sq"] = s["exp_avg_sq"].double()
            self.assertFalse(s["exp_avg"].is_contiguous())
        opt.load_state_dict(sd)
        del sd
        got = opt.state_dict()["state"]
        for i in want:
            for k in want[i]:
                self.assertTrue(torch.equal(got[i][k], want[i][k]), (i, k))
        opt.close()

    def test_an_earlier_optimizer_state_alone_keeps_the_models_weights(self):
        # bf16: the optimizer's state dict of step 2 (its fp32 masters then) loaded into an
        # optimizer whose model went on to step 6, without the model's: the weights stay the
        # model's (as torch's AdamW, and worker=False), not the step-2 masters
        data = [(x.bfloat16(), y) for x, y in batches(7)]

        def steps(model, opt, batches):
            for x, y in batches:
                opt.zero_grad()
                (model(x).float() - y).square().mean().backward()
                opt.step()
        got = {}
        for worker in (True, False):
            model = mlp(dtype=torch.bfloat16)
            with ours(model.parameters(), lr=1e-2, worker=worker) as opt:
                steps(model, opt, data[:2])
                early = {"state": {k: {n: t.clone() for n, t in v.items()}
                                   for k, v in opt.state_dict()["state"].items()},
                         "param_groups": opt.state_dict()["param_groups"]}
                steps(model, opt, data[2:6])
                before = [p.detach().clone() for p in model.parameters()]
                opt.load_state_dict(early)
                steps(model, opt, data[6:])
                got[worker] = [p.detach().clone() for p in model.parameters()]
            # one step of Adam moves each weight by about lr
            moved = max(float((a.float() - b.float()).abs().max())
                        for a, b in zip(got[worker], before))
            self.assertLess(moved, 0.02, f"worker={worker}")
        assert_equal(self, got[True], got[False])

    def test_a_step_count_reset_to_zero_keeps_the_moments(self):
        # opt.state[p]["step"] = 0 (a warmup restart that keeps the moments, as torch allows):
        # the entry stays in optimizer.state and in the state dict, an edit of another
        # parameter of its group after a state_dict() keeps its moments, and a checkpoint taken
        # then resumes as torch's AdamW goes on
        data = batches(6)

        def reset(model, o):
            train(model, o, data[:3])
            first, second = list(model.parameters())[:2]
            o.state[first]["step"] = torch.tensor(0.0)
            self.assertEqual(float(o.state_dict()["state"][0]["step"]), 0.0)
            o.state[second]["exp_avg"].mul_(0.5)
        ref, theirs, a, opt = edited_alike(reset)
        with opt:
            mine = opt.state_dict()["state"]
            for k, entry in theirs.state_dict()["state"].items():
                for key in ("step", "exp_avg", "exp_avg_sq"):
                    assert_close(self, [mine[k][key]], [entry[key]])
            saved, model_saved = opt.state_dict(), a.state_dict()
        resumes_as_torch(self, saved, model_saved, ref, theirs, data[3:])

    def test_a_librarys_own_state_keys_are_kept(self):
        # keys a library adds to an entry (an EMA of the weights, a note) stay in
        # optimizer.state and the state dict across steps and a checkpoint, as torch's AdamW
        # keeps them
        data = batches(5)

        def annotate(model, o):
            train(model, o, data[:2])
            first = next(model.parameters())
            o.state[first]["ema"] = first.detach().clone()
            o.state[first]["note"] = "warm"
            train(model, o, data[2:4])
            o.state[first]["ema"].mul_(0.5)
        ref, theirs, a, opt = edited_alike(annotate)
        with opt:
            saved = opt.state_dict()
            want = theirs.state_dict()
            for k, entry in want["state"].items():
                self.assertEqual(sorted(saved["state"][k]), sorted(entry), k)
                for key, value in entry.items():
                    if isinstance(value, torch.Tensor):
                        assert_close(self, [saved["state"][k][key]], [value])
                    else:
                        self.assertEqual(saved["state"][k][key], value)
            model_saved = a.state_dict()
        after = resumes_as_torch(self, saved, model_saved, ref, theirs, data[4:])
        self.assertEqual(after["state"][0]["note"], "warm")

    def test_a_librarys_keys_load_as_torchs_load_casts_them(self):
        # a floating-point tensor in the parameter's dtype (on its device), as torch's load
        # makes it; and kept in a group with no element here (an FSDP2 shard left empty)
        model = mlp(dtype=torch.bfloat16)
        empty = torch.nn.Parameter(torch.ones(0))
        groups = [{"params": list(model.parameters())}, {"params": [empty]}]
        for kind in ("torch", True, False):
            opt = torch.optim.AdamW(groups, lr=1e-2) if kind == "torch" else \
                ours(groups, lr=1e-2, worker=kind)
            for step in range(3):
                for p in (*model.parameters(), empty):
                    p.grad = torch.ones_like(p)
                opt.step()
                if step == 0:
                    opt.state[empty]["ema"] = torch.zeros(0)
            with self.subTest(kind=kind):
                self.assertIn("ema", opt.state[empty])  # two steps later
                first = next(model.parameters())
                sd = opt.state_dict()
                sd["state"][0]["ema"] = torch.zeros(first.shape, dtype=torch.float32)
                sd["state"][0]["steps_seen"] = [torch.ones(2, dtype=torch.float64), 3]
                opt.load_state_dict(sd)
                self.assertEqual(opt.state[first]["ema"].dtype, torch.bfloat16)
                seen = opt.state[first]["steps_seen"]
                self.assertEqual((seen[0].dtype, seen[1]), (torch.bfloat16, 3))
                self.assertIn("ema", opt.state_dict()["state"][len(list(model.parameters()))])
            getattr(opt, "close", lambda: None)()

    def test_a_step_count_written_where_a_group_has_no_element_is_kept(self):
        # a group with no element here (an FSDP2 shard left empty): a count written into
        # optimizer.state, or an entry deleted, is what the next step goes on from, as in torch
        # (the worker's optimizer kept its own count and gave 2 for 101)
        full = torch.nn.Parameter(torch.ones(4))
        empty = torch.nn.Parameter(torch.ones(0))
        groups = [{"params": [full]}, {"params": [empty]}]
        counts = {}
        for kind in ("torch", True, False):
            opt = torch.optim.AdamW(groups, lr=1e-2) if kind == "torch" else \
                ours(groups, lr=1e-2, worker=kind)
            seen = []
            for step in range(4):
                for p in (full, empty):
                    p.grad = torch.ones_like(p)
                opt.step()
                if step == 0:
                    opt.state[empty]["step"] = torch.tensor(100.0)
                    opt.state[full]["step"] = torch.tensor(100.0)
                if step == 2:
                    del opt.state[empty]
                seen.append([float(opt.state_dict()["state"].get(k, {}).get("step", -1))
                             for k in (0, 1)])
            counts[kind] = seen
            getattr(opt, "close", lambda: None)()
        self.assertEqual(counts["torch"], [[100.0, 100.0], [101.0, 101.0], [102.0, -1.0],
                                           [103.0, 1.0]])
        self.assertEqual(counts[True], counts["torch"])
        self.assertEqual(counts[False], counts["torch"])

    def test_mismatched_state_dict_is_refused(self):
        a, _ = twins()
        with ours(groups_of(a)) as opt:
            sd = opt.state_dict()
            sd["param_groups"] = sd["param_groups"][:2]
            with self.assertRaisesRegex(ValueError, "3 param groups|2 param groups"):
                opt.load_state_dict(sd)
            sd = torch.optim.AdamW(groups_of(a), amsgrad=True).state_dict()
            with self.assertRaisesRegex(ValueError, "amsgrad"):
                opt.load_state_dict(sd)

    def test_a_checkpoint_of_a_capturable_torch_adamw_loads(self):
        # capturable and differentiable say how torch's AdamW ran (CUDA graphs, autograd), not
        # what it saved: its checkpoint loads, and this optimizer's groups keep False
        data = batches(4)
        ref, a, b = mlp(), mlp(), mlp()
        theirs = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        train(ref, theirs, data[:2])
        plain = theirs.state_dict()
        flagged = {"state": plain["state"],
                   "param_groups": [dict(g, capturable=True, differentiable=True)
                                    for g in plain["param_groups"]]}
        a.load_state_dict(ref.state_dict())
        b.load_state_dict(ref.state_dict())
        for model, sd in ((a, plain), (b, flagged)):
            for worker in (True, False):
                with ours(model.parameters(), lr=1e-2, worker=worker) as opt:
                    opt.load_state_dict(sd)
                    self.assertFalse(opt.param_groups[0]["capturable"])
                    # (torch 1.13's AdamW has none)
                    self.assertFalse(opt.param_groups[0].get("differentiable", False))
                    train(model, opt, data[2:3])
        assert_equal(self, list(a.parameters()), list(b.parameters()))

    def test_malformed_state_dicts_are_refused_saying_why(self):
        # refused whole, with nothing changed, in torch's terms rather than a KeyError from
        # inside; maximize differing between groups too (torch's AdamW takes it, but every step
        # here would refuse it)
        import copy
        cases = [
            ("a group without params", lambda d: d["param_groups"][1].pop("params"),
             ValueError, "param group 1 of the state dict is not a dict with a 'params' list"),
            ("state as a list", lambda d: d.__setitem__("state", list(d["state"].values())),
             TypeError, "'state' a dict, not a list and a list"),
            ("an entry that is a tensor", lambda d: d["state"].__setitem__(0, torch.zeros(3)),
             TypeError, "parameter 0: its state is a Tensor, not a dict"),
            ("maximize in one group", lambda d: d["param_groups"][2].__setitem__("maximize",
                                                                                   True),
             ValueError, "maximize differs between the state dict's param groups"),
            ("a step beyond 2^53", lambda d: d["state"][5].__setitem__("step",
                                                                       torch.tensor(1e19)),
             ValueError, "step must be at most 2\\^53"),  # (the worker's int64 wrapped it)
        ]
        for worker in (True, False):
            a = mlp()
            with ours(groups_of(a), lr=1e-2, worker=worker) as opt:
                train(a, opt, batches(2))
                good = copy.deepcopy(opt.state_dict())
                for name, spoil, error, message in cases:
                    bad = copy.deepcopy(good)
                    spoil(bad)
                    with self.subTest(worker=worker, case=name):
                        with self.assertRaisesRegex(error, message):
                            opt.load_state_dict(bad)
                        now = opt.state_dict()
                        self.assertEqual(now["param_groups"], good["param_groups"])
                        for k, entry in good["state"].items():
                            assert_equal(self, list(now["state"][k].values()),
                                         list(entry.values()))


class Overflow(unittest.TestCase):
    def snapshot(self, model, opt):
        return ([p.detach().clone() for p in model.parameters()], moved_state(opt),
                [s.master.clone() for l in opt._layouts for s in l.slots])

    def test_nonfinite_step_writes_nothing(self):
        # fp16 parameters (grads set directly: CPU fp16 matmul is not everywhere)
        model = mlp(dtype=torch.float16)
        ref = mlp(dtype=torch.float16)
        gen = torch.Generator().manual_seed(5)
        grads = [[torch.randn(p.shape, generator=gen).half() for p in model.parameters()]
                 for _ in range(6)]
        with ours(model.parameters(), lr=1e-2, skip_nonfinite=True) as opt, \
                ours(ref.parameters(), lr=1e-2, skip_nonfinite=True) as opt_ref:
            for step, gs in enumerate(grads):
                if step == 3:
                    before = self.snapshot(model, opt)
                    bad = [g.clone() for g in gs]
                    bad[2].view(-1)[7] = float("inf")
                    for p, g in zip(model.parameters(), bad):
                        p.grad = g
                    opt.step(grad_scale=0.5)
                    self.assertTrue(opt.last_step_skipped)
                    after = self.snapshot(model, opt)
                    assert_equal(self, after[0], before[0])
                    assert_equal(self, after[2], before[2])
                    self.assertEqual(sorted(after[1]), sorted(before[1]))
                    for i in before[1]:
                        for k in before[1][i]:
                            self.assertTrue(torch.equal(after[1][i][k], before[1][i][k]), k)
                for m, o in ((model, opt), (ref, opt_ref)):
                    for p, g in zip(m.parameters(), gs):
                        p.grad = g.clone()
                    o.step(grad_scale=0.5)
                    self.assertFalse(o.last_step_skipped)
            # the skipped step left no trace: same as a run that never saw it
            assert_equal(self, model.parameters(), ref.parameters())

    def test_without_the_flag_nonfinite_is_applied_and_counted(self):
        a, _ = twins()
        with ours(a.parameters()) as opt:
            for p in a.parameters():
                p.grad = torch.zeros_like(p)
            a[0].weight.grad[0, 0] = float("nan")
            opt.step()
            self.assertFalse(opt.last_step_skipped)
            self.assertEqual(opt.last_nonfinite, 1)
            self.assertTrue(torch.isnan(a[0].weight[0, 0]))


class Clipping(unittest.TestCase):
    def test_max_grad_norm_is_clip_grad_norm(self):
        a, b = twins()
        data = batches(20)
        opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
        with ours(a.parameters(), lr=1e-2, max_grad_norm=0.05) as opt_a:
            for x, y in data:
                opt_a.zero_grad()
                opt_b.zero_grad()
                torch.nn.functional.mse_loss(a(x), y).backward()
                torch.nn.functional.mse_loss(b(x), y).backward()
                norm = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.05)
                opt_a.step()
                opt_b.step()
                self.assertAlmostEqual(opt_a.last_grad_norm, float(norm), delta=1e-5 * float(norm))
            self.assertGreater(float(norm), 0.05)  # the clip was active
            assert_close(self, a.parameters(), b.parameters())


if __name__ == "__main__":
    unittest.main()
