"""zenflow_bind.optim.AdamW's modes: gradients in shared memory and parameters the worker never
writes, bf16 parameters with fp32 master weights, ZenFlow's overlap, and its errors."""

import copy
import os
import signal
import threading
import time
import unittest

import torch

from torch_cases import alive, assert_close, assert_equal, batches, mlp, ours, twins
import zenflow_bind.optim as zt
from zenflow_bind import ZenbindError


HOOKS = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def shared(tensor, views):
    return any(tensor.data_ptr() == v.data_ptr() for v in views)


class SharedMemory(unittest.TestCase):
    def test_grads_are_shared_and_parameters_private(self):
        a, _ = twins()
        x, y = batches(1)[0]
        with ours(a.parameters()) as opt:
            slots = [s for l in opt._layouts for s in l.slots]
            for set_to_none in (True, False, False):
                opt.zero_grad(set_to_none=set_to_none)
                torch.nn.functional.mse_loss(a(x), y).backward()
                # after one step the grads are views of the gradient buffer, and backward
                # (torch 1.13's AccumulateGrad) adds into them in place; from torch 2.1 a hook
                # puts new ones there too (test_torch_streaming)
                in_place = [shared(s.param.grad, s.grads) for s in slots]
                self.assertEqual(all(in_place), not set_to_none or HOOKS)
                opt.step()
                self.assertTrue(all(shared(s.param.grad, s.grads) for s in slots))
                # the worker writes its master; the model gets a copy once the step is done
                self.assertFalse(any(shared(s.param, [s.master]) for s in slots))
                assert_equal(self, [s.param for s in slots], [s.master for s in slots])
            grads = [p.grad.clone() for p in a.parameters()]
        # closed: the gradients have private memory again, with their values
        for s, g in zip(slots, grads):
            self.assertFalse(shared(s.param.grad, s.grads))
            self.assertTrue(torch.equal(s.param.grad, g))

    def test_one_gradient_buffer_unless_overlap(self):
        # blocking steps never fill a buffer while the worker reads the other: one is kept, and
        # the shared memory is 16 bytes per fp32 parameter (master 4, gradient 4, moments 8)
        for overlap, buffers in ((False, 1), (True, 2)):
            model = mlp()
            n = sum(p.numel() for p in model.parameters())
            with ours(model.parameters(), overlap=overlap) as opt:
                self.assertEqual({len(s.grads) for l in opt._layouts for s in l.slots}, {buffers})
                m = opt.worker.memory()
                self.assertEqual(m["grads"], 4 * buffers * n)
                self.assertEqual(m["bytes_per_param"], 12 + 4 * buffers)
                x, y = batches(1)[0]
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.synchronize()
                opt.overlap = overlap  # the same value is fine; another is refused
                with self.assertRaisesRegex(AttributeError, "fixed when the optimizer is made"):
                    opt.overlap = not overlap

    def test_user_writes_reach_the_master(self):
        # model.load_state_dict after the optimizer was built, for fp32 and bf16
        for dtype in (torch.float32, torch.bfloat16):
            a, b = mlp(dtype=dtype), mlp(seed=3, dtype=dtype)
            with ours(a.parameters(), lr=0.0, weight_decay=0.0) as opt:
                a.load_state_dict(b.state_dict())
                for p in a.parameters():
                    p.grad = torch.zeros_like(p)
                opt.step()
                assert_equal(self, a.parameters(), b.parameters())


class MixedPrecision(unittest.TestCase):
    def test_bf16_parameters_with_fp32_master(self):
        model = mlp(dtype=torch.bfloat16)
        master = [p.detach().float().requires_grad_() for p in model.parameters()]
        ref = torch.optim.AdamW(master, lr=1e-4)
        gen = torch.Generator().manual_seed(3)
        with ours(model.parameters(), lr=1e-4) as opt:
            slots = [s for l in opt._layouts for s in l.slots]
            self.assertFalse(any(shared(s.param, [s.copy, s.master]) for s in slots))
            for _ in range(30):
                for p, m in zip(model.parameters(), master):
                    p.grad = torch.randn(p.shape, generator=gen).bfloat16()
                    self.assertEqual(p.grad.dtype, torch.bfloat16)
                    m.grad = p.grad.float()
                opt.step()
                ref.step()
            state = opt.state_dict()["state"]
            ours_master = [state[i]["master_param"] for i in range(len(master))]
            assert_close(self, ours_master, master)
            # the model holds the master rounded to bf16; steps of 1e-4 are below bf16's
            # resolution for most weights, so without the fp32 master they would not move
            for p, m in zip(model.parameters(), ours_master):
                self.assertTrue(torch.equal(p.detach(), m.bfloat16()))
            moved = sum(int((p.detach() != m.detach().bfloat16()).sum())
                        for p, m in zip(mlp(dtype=torch.bfloat16).parameters(), master))
            self.assertGreater(moved, 100)

    def test_mixed_dtypes_in_one_group(self):
        # fp32 gradients for the group; the bf16 parameter converts to and from the fp32 master
        gen = torch.Generator().manual_seed(6)
        wide = torch.nn.Parameter(torch.randn(300, generator=gen))
        narrow = torch.nn.Parameter(torch.randn(200, generator=gen).bfloat16())
        ref = [wide.detach().clone().requires_grad_(), narrow.detach().float().requires_grad_()]
        opt_ref = torch.optim.AdamW(ref, lr=1e-3)
        with ours([wide, narrow], lr=1e-3) as opt:
            self.assertEqual(opt._layouts[0].group.groups[0].grad_dtype, "fp32")
            for _ in range(10):
                wide.grad = torch.randn(300, generator=gen)
                narrow.grad = torch.randn(200, generator=gen).bfloat16()
                ref[0].grad, ref[1].grad = wide.grad.clone(), narrow.grad.float()
                opt.step()
                opt_ref.step()
            master = opt.state_dict()["state"][1]["master_param"]
        assert_close(self, [wide, master], ref)
        self.assertEqual(narrow.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(narrow.detach(), master.bfloat16()))

    def test_bf16_checkpoint_keeps_the_master(self):
        model = mlp(dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(4)
        with ours(model.parameters(), lr=1e-4) as opt:
            for _ in range(5):
                for p in model.parameters():
                    p.grad = torch.randn(p.shape, generator=gen).bfloat16()
                opt.step()
            sd = opt.state_dict()
        with ours(model.parameters()) as opt:
            opt.load_state_dict(sd)
            got = opt.state_dict()["state"]
        for i, state in sd["state"].items():
            self.assertFalse(torch.equal(state["master_param"].bfloat16().float(),
                                         state["master_param"]))  # more than bf16 holds
            self.assertTrue(torch.equal(got[i]["master_param"], state["master_param"]))


    def test_resume_keeps_the_master_whatever_is_loaded_first(self):
        # A checkpoint of a bf16 model and its optimizer, loaded into a new pair in either
        # order: the run goes on bit for bit, so the fp32 master came back with its extra bits
        # (the model's own writes made it stale, and its values agree with the master's).
        def train(model, opt, data):
            for x, y in data:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x).float(), y).backward()
                opt.step()

        data = [(x.bfloat16(), y) for x, y in batches(6)]
        model = mlp(dtype=torch.bfloat16)
        with ours(model.parameters(), lr=1e-4) as opt:
            train(model, opt, data[:3])
            saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
            train(model, opt, data[3:])
        for model_first in (True, False):
            twin = mlp(dtype=torch.bfloat16, seed=11)
            with ours(twin.parameters(), lr=1e-4) as opt:
                if model_first:
                    twin.load_state_dict(saved[0])
                opt.load_state_dict(saved[1])
                if not model_first:
                    twin.load_state_dict(saved[0])
                train(twin, opt, data[3:])
            for p, q in zip(model.parameters(), twin.parameters()):
                self.assertTrue(torch.equal(p, q), f"model loaded first: {model_first}")


class Overlap(unittest.TestCase):
    def test_update_lands_one_step_later(self):
        # The same gradients in both modes: after step() k the overlapped model holds the
        # blocking model's weights after k - 1 steps, and after synchronize() those after k.
        gen = torch.Generator().manual_seed(9)
        grads = [[torch.randn(p.shape, generator=gen) for p in mlp().parameters()]
                 for _ in range(8)]
        blocking, overlapped = twins()
        history = [[p.detach().clone() for p in blocking.parameters()]]
        with ours(blocking.parameters(), lr=1e-2) as opt:
            for gs in grads:
                for p, g in zip(blocking.parameters(), gs):
                    p.grad = g.clone()
                opt.step()
                history.append([p.detach().clone() for p in blocking.parameters()])
        with ours(overlapped.parameters(), lr=1e-2, overlap=True) as opt:
            for k, gs in enumerate(grads, 1):
                opt.zero_grad()
                for p, g in zip(overlapped.parameters(), gs):
                    if p.grad is None:
                        p.grad = g.clone()
                    else:
                        p.grad += g  # in place, as backward does
                opt.step()
                assert_equal(self, overlapped.parameters(), history[k - 1])
                assert_equal(self, [p.grad for p in overlapped.parameters()], gs)
            opt.synchronize()
            assert_equal(self, overlapped.parameters(), history[-1])

    def test_copies_to_the_gpu_are_done_before_the_next_step_goes(self):
        # On a GPU the copies of an applied update into the model (_cuda.Gpu: queued, then
        # publish()) read the masters and copy-outs asynchronously; with overlap, step() applies
        # the step before and submits the next, which rewrites them: settle() between the two.
        model = mlp()
        calls = []
        with ours(model.parameters(), overlap=True) as opt:
            def recorded(name, call):
                def wrapper(*args, **kwargs):
                    calls.append(name)
                    return call(*args, **kwargs)
                return wrapper
            opt._gpu.publish = recorded("publish", opt._gpu.publish)
            opt._gpu.settle = recorded("settle", opt._gpu.settle)
            opt._worker.submit = recorded("submit", opt._worker.submit)
            for x, y in batches(4):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            opt.synchronize()
        self.assertEqual(calls.count("submit"), 4)
        for i, call in enumerate(calls):
            if call == "submit" and "publish" in calls[:i]:
                since = calls[:i][::-1]
                self.assertLess(since.index("settle"), since.index("publish"), calls)

    def test_training_with_overlap_lowers_the_loss(self):
        model = mlp()
        target = mlp(seed=4)
        gen = torch.Generator().manual_seed(2)
        losses = []
        with ours(model.parameters(), lr=3e-3, overlap=True) as opt:
            for _ in range(150):
                x = torch.randn(32, 16, generator=gen)
                with torch.no_grad():
                    y = target(x)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                losses.append(float(loss))
        self.assertLess(sum(losses[-10:]) / 10, 0.3 * sum(losses[:10]) / 10)


class Environment(unittest.TestCase):
    def test_worker_takes_the_plugin_environment_unless_told(self):
        cpus = sorted(os.sched_getaffinity(0))
        saved = {k: os.environ.get(k) for k in ("ZENFLOW_OPT_CPUS", "ZENFLOW_OPT_THREADS")}
        os.environ.update(ZENFLOW_OPT_CPUS=str(cpus[0]), ZENFLOW_OPT_THREADS="1")
        try:
            with zt.AdamW(mlp().parameters()) as opt:
                self.assertEqual([cpu for _, cpu in opt.worker.threads()], [cpus[0]])
            with zt.AdamW(mlp().parameters(), cpus=str(cpus[-1]), threads=2) as opt:
                self.assertEqual([cpu for _, cpu in opt.worker.threads()], [cpus[-1]] * 2)
            # as ints too: one, or any iterable (os.sched_getaffinity's set)
            import numpy as np
            for given in (cpus[-1], [cpus[-1]], {cpus[-1]}, range(cpus[-1], cpus[-1] + 1),
                          np.int64(cpus[-1]), np.array([cpus[-1]])):
                with zt.AdamW(mlp().parameters(), cpus=given, threads=1) as opt:
                    self.assertEqual([cpu for _, cpu in opt.worker.threads()], [cpus[-1]])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_a_worker_under_an_offload_plan_is_warned(self):
        # mode=offload gives the task every CPU and the worker none: a default AdamW's worker
        # shares the training CPUs, which worker=False or cpus= avoid
        import warnings
        from unittest import mock
        cpu = str(min(os.sched_getaffinity(0)))
        with mock.patch.dict(os.environ, {"ZENFLOW_BIND_OPTIONS": "mode=offload,verbose"}):
            os.environ.pop("ZENFLOW_OPT_CPUS", None)
            with self.assertWarnsRegex(UserWarning, r"mode=offload .*worker=False") as ctx:
                zt.AdamW(mlp().parameters()).close()
            self.assertEqual(ctx.filename, __file__)  # the caller's line
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                zt.AdamW(mlp().parameters(), cpus=cpu).close()
                zt.AdamW(mlp().parameters(), worker=False).close()
                os.environ["ZENFLOW_BIND_OPTIONS"] = "verbose"
                zt.AdamW(mlp().parameters()).close()

    def test_openmp_binding_does_not_narrow_the_default_cpus(self):
        # OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY make OpenMP (torch's, ours) pin the
        # process to its first place before Python starts: the worker took that one CPU, the
        # trainer's own, as "the caller's CPUs"
        import json
        import subprocess
        import sys
        script = ("import torch, zenflow_bind.optim as zt\n"
                  "with zt.AdamW(torch.nn.Linear(4, 4).parameters()) as opt:\n"
                  "    print(sorted({cpu for _, cpu in opt.worker.threads()}))\n")
        base = {k: v for k, v in os.environ.items()
                if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                             "ZENFLOW_OPT_CPUS", "ZENFLOW_OPT_THREADS")}
        for var, value in (("OMP_PROC_BIND", "close"), ("OMP_PLACES", "cores")):
            r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=120, env={**base, var: value})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout), sorted(os.sched_getaffinity(0)), var)


class Names(unittest.TestCase):
    def test_old_module_name_is_a_deprecated_alias(self):
        import importlib
        import sys
        import warnings
        sys.modules.pop("zenflow_bind.torch", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = importlib.import_module("zenflow_bind.torch")
        self.assertIs(old.AdamW, zt.AdamW)
        self.assertTrue(any(issubclass(w.category, FutureWarning) and
                            "zenflow_bind.optim" in str(w.message) for w in caught))


class Errors(unittest.TestCase):
    def test_a_model_cast_after_the_optimizer_was_made_is_refused(self):
        # Module.to() re-seats each parameter's .data. A move to another device is followed
        # (test_gpu.py: a model moved to the GPU after the optimizer was made, as the Hugging
        # Face Trainer and accelerate's prepare() move it); a cast is refused by step(), as the
        # worker's buffers were made for the dtype it had, and the optimizer stays usable
        model = mlp()
        x, y = batches(1)[0]
        with ours(model.parameters()) as opt:
            before = [p.detach().clone() for p in model.parameters()]
            model.to(torch.float64)
            loss = torch.nn.functional.mse_loss(model(x.double()), y.double())
            loss.backward()  # the hook leaves it to step() (torch >= 2.1)
            with self.assertRaisesRegex(ValueError, "float32 when its param group was added "
                                        "and is now torch.float64: make the optimizer after "
                                        "casting"):
                opt.step()
            model.to(torch.float32)
            assert_equal(self, model.parameters(), before)
            opt.step()  # the float32 gradients Module.to() cast back
            self.assertFalse(torch.equal(next(model.parameters()), before[0]))

    def test_refused_arguments_say_why(self):
        params = mlp().parameters
        for kw, why in (({"amsgrad": True}, "fourth state stream"),
                        ({"capturable": True}, "CUDA graph"),
                        ({"differentiable": True}, "outside autograd"),
                        ({"lr": -1.0}, "learning rate"),
                        ({"betas": (1.0, 0.9)}, "betas"),
                        ({"eps": -1e-8}, "eps"),
                        ({"weight_decay": -0.1}, "weight_decay"),
                        ({"max_grad_norm": -1.0}, "max_grad_norm")):
            with self.assertRaisesRegex(ValueError, why):
                ours(params(), **kw)
        with self.assertRaisesRegex(TypeError, "torch.float64"):
            ours([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
        for kw in ({"adamw_mode": None}, {"adamw_mode": "False"}, {"bias_correction": None},
                   {"bias_correction": 2}):
            with self.assertRaisesRegex(TypeError, "must be True or False"):  # not taken for one
                ours(params(), **kw)
        import numpy
        for false in (numpy.False_, torch.tensor(False), 0):  # what equals False is False
            with ours(params(), bias_correction=false) as opt:
                self.assertIs(opt.param_groups[0]["bias_correction"], False)
        with ours(params()) as opt:
            with self.assertRaisesRegex(TypeError, "bias_correction must be True or False"):
                opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))],
                                     "bias_correction": "yes"})
            self.assertEqual(len(opt.param_groups), 1)
        with self.assertRaisesRegex(ValueError, "amsgrad"):
            opt = ours(params())
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))],
                                 "amsgrad": True})
        self.assertEqual(len(opt.param_groups), 1)  # the refused group was not kept
        opt.close()

    def test_mixed_maximize_is_refused(self):
        a, _ = twins()
        with ours([{"params": a[0].parameters(), "maximize": True},
                   {"params": a[2].parameters()}]) as opt:
            for p in a.parameters():
                p.grad = torch.ones_like(p)
            with self.assertRaisesRegex(ValueError, "maximize"):
                opt.step()

    def test_closed_optimizer(self):
        a, _ = twins()
        opt = ours(a.parameters())
        opt.close()
        for call in (opt.step, opt.state_dict, opt.synchronize):
            with self.assertRaisesRegex(ZenbindError, "was closed"):
                call()

    def test_dead_worker(self):
        # Every error says what the model holds and how to go on.
        a, _ = twins()
        for p in a.parameters():
            p.grad = torch.ones_like(p)
        with ours(a.parameters()) as opt:  # dead before the step: nothing applied
            pid = opt.worker.pid
            os.kill(pid, signal.SIGKILL)
            while alive(pid):  # the kill lands before the step starts
                time.sleep(0.01)
            time.sleep(0.2)  # and its exit reaches the pidfd libzenbind polls (a busy host lags)
            with self.assertRaises(ZenbindError) as ctx:
                opt.step()
                opt.step()
            self.assertEqual(ctx.exception.status, "EDEAD")
            self.assertIn("nothing of this step was applied", str(ctx.exception))
        checkpoint = None
        for overlap in (False, True):
            opt = ours(a.parameters(), overlap=overlap)  # dead during the step
            if checkpoint is None:
                opt.step()
                checkpoint = copy.deepcopy(opt.state_dict())
            os.kill(opt.worker.pid, signal.SIGSTOP)
            threading.Timer(0.3, os.kill, (opt.worker.pid, signal.SIGKILL)).start()
            with self.assertRaisesRegex(ZenbindError, "holds its parameters from before"):
                opt.step()
                opt.synchronize()
            # the recovery the error gives: a new optimizer over the same parameters (the dead
            # one is closed for it), from the last checkpoint
            with ours(a.parameters(), overlap=overlap) as again:
                self.assertTrue(opt.worker.closed)
                again.load_state_dict(checkpoint)
                again.step()
                again.synchronize()
                self.assertEqual(float(again.state_dict()["state"][0]["step"]), 2.0)
        # killed with no call since (an overlap step in flight, or none): found dead when the
        # new one comes
        for overlap in (False, True):
            opt = ours(a.parameters(), overlap=overlap)
            pid = opt.worker.pid
            if overlap:  # a step that never completes
                os.kill(pid, signal.SIGSTOP)
                opt.step()
            os.kill(pid, signal.SIGKILL)
            while alive(pid):
                time.sleep(0.01)
            ours(a.parameters()).close()
            self.assertTrue(opt.worker.closed)
        # one stopped (a suspended job) is alive: refused, as any live one
        with ours(a.parameters()) as opt:
            os.kill(opt.worker.pid, signal.SIGSTOP)
            try:
                with self.assertRaisesRegex(ValueError, "another zenflow_bind.optim.AdamW"):
                    ours(a.parameters())
            finally:
                os.kill(opt.worker.pid, signal.SIGCONT)

    def test_a_worker_killed_mid_step_leaves_the_model_as_it_was(self):
        # The worker is killed while its kernel is writing the master weights: they are torn,
        # some elements updated and some not, but the model holds its pre-step values exactly.
        for dtype in (torch.float32, torch.bfloat16):
            big = torch.nn.Parameter(torch.rand(1 << 25).to(dtype))
            before = big.detach().clone()
            with ours([big], threads=1) as opt:
                master = opt._layouts[0].slots[0].master
                first = master[0].item()
                big.grad = torch.ones_like(big)

                def kill_once_writing():
                    deadline = time.monotonic() + 60
                    while master[0].item() == first and time.monotonic() < deadline:
                        pass  # the kernel starts at element 0
                    os.kill(opt.worker.pid, signal.SIGKILL)

                killer = threading.Thread(target=kill_once_writing)
                killer.start()
                with self.assertRaisesRegex(ZenbindError, "holds its parameters from before"):
                    opt.step()
                killer.join()
                old = master == before.float()
                self.assertFalse(bool(old.all()), "the kill landed before the kernel wrote")
                self.assertTrue(bool(old.any()), "the kill landed after the whole step")
                self.assertTrue(torch.equal(big.detach(), before), dtype)

    def test_timeout_leaves_the_step_in_flight(self):
        # 32M elements: the step takes about 0.1 s, so the poll right after submit finds it in
        # flight even when this process is descheduled for a while (1 << 23 was not always)
        big = torch.nn.Parameter(torch.zeros(1 << 25))
        opt = ours([big], timeout_ms=0)
        big.grad = torch.ones_like(big)
        with self.assertRaises(ZenbindError) as ctx:
            opt.step()
        self.assertEqual(ctx.exception.status, "ETIMEDOUT")
        opt.timeout_ms = 60_000
        opt.synchronize()
        self.assertTrue(bool((big < 0).all()))  # the step landed
        opt.close()

    def test_bad_cpus(self):
        with self.assertRaises(ZenbindError) as ctx:
            ours(mlp().parameters(), cpus="no-such-list")
        self.assertEqual(ctx.exception.status, "EINVAL")
        for bad, error in ((2.5, TypeError), ([-1], ValueError), ([], ValueError),
                           ([True], ValueError), (b"0-3", TypeError),
                           (bytearray(b"0"), TypeError)):
            with self.assertRaisesRegex(error, "cpu list such as", msg=repr(bad)):
                ours(mlp().parameters(), cpus=bad)


if __name__ == "__main__":
    unittest.main()
