"""zenflow_bind.optim.AdamW when things go wrong, as a careless but realistic user makes them go
wrong: Ctrl-C during a step, optimizers dropped without close(), two threads stepping at once, a
load_state_dict that fails half-way, and bad input. Nothing may be lost or torn: each case ends
where torch.optim.AdamW would, or with a clear error that names the parameter."""

import copy
import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import torch

from torch_cases import (alive, assert_close, assert_equal, batches, groups_of, mlp, ours,
                         proc_stat, train, twins)
import zenflow_bind.optim as zt
from zenflow_bind import ZenbindError


def segments(collect=True):
    """How many of the workers' shared segments this process maps, after collecting garbage
    (an optimizer an earlier test dropped) unless collect is False."""
    if collect:
        gc.collect()
    with open("/proc/self/maps") as f:
        return sum("zenflow parameter group" in line for line in f)


def children():
    """Pids of this process's live child processes."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and alive(pid) and
            int((proc_stat(pid) or [0, 0])[1]) == os.getpid()]


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class Interrupt(unittest.TestCase):
    def test_ctrl_c_in_a_stuck_step_is_seen_at_once_and_loses_nothing(self):
        a, b = mlp(), mlp()
        data = batches(4)
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            train(a, opt, data[:2])
            train(b, ref, data[:2])
            x, y = data[2]
            opt.zero_grad()
            torch.nn.functional.mse_loss(a(x), y).backward()
            os.kill(opt.worker.pid, signal.SIGSTOP)  # the worker stops answering
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            start = time.monotonic()
            try:
                with self.assertRaises(KeyboardInterrupt):
                    opt.step()
                self.assertLess(time.monotonic() - start, 1.5)
            finally:
                os.kill(opt.worker.pid, signal.SIGCONT)
            # the step was submitted: the save-on-interrupt finishes it and counts it
            sd = opt.state_dict()
            self.assertEqual(float(sd["state"][0]["step"]), 3.0)
            train(b, ref, [data[2]])
            train(a, opt, data[3:])
            train(b, ref, data[3:])
            assert_close(self, a.parameters(), b.parameters())


    def test_ctrl_c_as_an_overlap_step_is_submitted_switches_the_buffer(self):
        # the step goes to the worker on buffer k: backward must fill the other one from then
        # on, Ctrl-C or not, or it would write the gradients the worker is reading
        from unittest import mock
        a = mlp()
        with ours(a.parameters(), lr=1e-2, overlap=True) as opt:
            x, y = batches(1)[0]
            torch.nn.functional.mse_loss(a(x), y).backward()
            k = opt._buffer
            real = opt._worker.submit

            def submit_then_ctrl_c(*args, **kwargs):
                real(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGINT)

            with mock.patch.object(opt._worker, "submit", side_effect=submit_then_ctrl_c):
                with self.assertRaises(KeyboardInterrupt):
                    opt.step()
            self.assertEqual(opt._buffer, 1 - k)
            slots = [s for layout in opt._layouts for s in layout.slots]
            self.assertFalse(any(s.param.grad.data_ptr() == s.grads[k].data_ptr()
                                 for s in slots))
            opt.synchronize()  # the step in flight lands
            self.assertEqual(float(opt.state_dict()["state"][0]["step"]), 1.0)


class JobSignals(unittest.TestCase):
    def test_a_step_stopped_past_its_timeout_completes_when_resumed(self):
        # Ctrl-Z or Slurm suspending the job stops the trainer and its worker alike: the time
        # stopped is not the worker's, and must not count against timeout_ms. Here the clock
        # jumps 1.5 s inside the first wait (the trainer stopped there), the worker stays
        # stopped 0.3 s more (it resumed last): the step completes, 1000 ms or not.
        from unittest import mock
        a = mlp()
        with ours(a.parameters(), lr=1e-2, timeout_ms=1000) as opt:
            train(a, opt, batches(1))
            x, y = batches(1)[0]
            torch.nn.functional.mse_loss(a(x), y).backward()
            jumped, real_wait = [0.0], opt._worker.wait_result
            real_now = zt._now_ms

            def wait_stopped(timeout_ms):
                if not jumped[0]:
                    jumped[0] = 1500.0
                    threading.Timer(0.3, os.kill, (opt.worker.pid, signal.SIGCONT)).start()
                return real_wait(timeout_ms)

            os.kill(opt.worker.pid, signal.SIGSTOP)
            try:
                with mock.patch.object(zt, "_now_ms", lambda: real_now() + jumped[0]), \
                        mock.patch.object(opt._worker, "wait_result", side_effect=wait_stopped):
                    opt.step()
            finally:
                os.kill(opt.worker.pid, signal.SIGCONT)
            self.assertEqual(float(opt.state_dict()["state"][0]["step"]), 2.0)

    def test_a_handler_that_raises_as_a_step_is_submitted_waits_until_it_is_recorded(self):
        # A SIGTERM or SIGUSR1 handler that raises (sys.exit, an exception to leave the loop)
        # and comes as the step goes to the worker: raised once the step is recorded as in
        # flight, so that the save after it finishes and counts the step.
        from unittest import mock

        class Stop(Exception):
            pass

        def stop(signum, frame):
            raise Stop(signum)

        for sig in (signal.SIGTERM, signal.SIGUSR1):
            a = mlp()
            before = signal.signal(sig, stop)
            try:
                with ours(a.parameters(), lr=1e-2) as opt:
                    x, y = batches(1)[0]
                    torch.nn.functional.mse_loss(a(x), y).backward()
                    real = opt._worker.submit

                    def submit_then_signal(*args, **kwargs):
                        real(*args, **kwargs)
                        os.kill(os.getpid(), sig)

                    with mock.patch.object(opt._worker, "submit", side_effect=submit_then_signal):
                        with self.assertRaises(Stop):
                            opt.step()
                    self.assertEqual(float(opt.state_dict()["state"][0]["step"]), 1.0)
            finally:
                signal.signal(sig, before)

    def test_every_held_signal_reaches_its_handler_the_first_raise_wins(self):
        from zenflow_bind._signals import deferred_interrupts
        ran, before = [], {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}

        def term(signum, frame):
            ran.append("TERM")
            raise SystemExit(3)

        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append("USR1"))
        try:
            with self.assertRaises(SystemExit) as ctx:
                with deferred_interrupts():
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                        os.kill(os.getpid(), s)  # SIGINT's handler raises KeyboardInterrupt
                    self.assertEqual(ran, [])  # held
            self.assertEqual(ctx.exception.code, 3)
            self.assertEqual(ran, ["TERM", "USR1"])
            self.assertIs(signal.getsignal(signal.SIGTERM), term)
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    def test_a_signal_as_the_handlers_go_back_leaves_none_held(self):
        # Ctrl-C lands right after SIGINT's handler is back, before SIGTERM's is: it raises
        # there, and SIGTERM's handler must still be put back.
        from unittest import mock
        from zenflow_bind._signals import deferred_interrupts
        ran, before, real = [], signal.getsignal(signal.SIGTERM), signal.signal

        def spy(signum, handler):
            out = real(signum, handler)
            if signum == signal.SIGINT and handler is signal.default_int_handler:
                os.kill(os.getpid(), signal.SIGINT)
            return out

        signal.signal(signal.SIGTERM, lambda signum, frame: ran.append("TERM"))
        try:
            with self.assertRaises(KeyboardInterrupt):
                with deferred_interrupts():
                    patch = mock.patch.object(signal, "signal", spy)
                    patch.start()
            patch.stop()
            os.kill(os.getpid(), signal.SIGTERM)
            self.assertEqual(ran, ["TERM"])
        finally:
            signal.signal(signal.SIGTERM, before)

    def test_a_checkpoint_on_sigterm_or_sigusr1_has_the_moments(self):
        # Slurm signals every process of a step (scancel, the time limit, --signal=USR1@T), as a
        # terminal does its process group: the worker gets the signal with the trainer, and must
        # still hold the Adam moments when the trainer's handler saves them.
        here = os.path.dirname(os.path.abspath(__file__))
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "ckpt.pt")
                script = os.path.join(here, "checkpoint_on_signal.py")
                p = subprocess.Popen([sys.executable, script, path], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
                try:
                    started = p.stdout.readline().startswith("training")
                    if started:
                        os.killpg(p.pid, sig)
                    out, err = p.communicate(timeout=60 if started else 150)
                    self.assertTrue(started, out + err)
                finally:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                self.assertEqual(p.returncode, 0, out + err)
                saved = torch.load(path)
                self.assertEqual(saved["signal"], sig.name)
                state = saved["optim"]["state"]
                self.assertEqual(sorted(state), [0, 1, 2, 3])
                for entry in state.values():
                    self.assertEqual(int(entry["step"]), saved["steps"])
                    self.assertGreater(float(entry["exp_avg_sq"].sum()), 0.0)


class Lifetime(unittest.TestCase):
    def test_dropped_optimizers_free_their_workers_fds_and_memory(self):
        model = mlp()
        x, y = batches(1)[0]

        def sweep(n):
            for _ in range(n):
                opt = ours(model.parameters(), lr=1e-3, threads=1)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                del opt
            gc.collect()

        sweep(3)  # warm: libraries loaded, allocator pools made
        procs, fds, rss = len(children()), len(os.listdir("/proc/self/fd")), rss_kib()
        sweep(100)
        deadline = time.monotonic() + 5
        while len(children()) > procs and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(len(children()), procs, "workers left behind")
        self.assertLessEqual(len(os.listdir("/proc/self/fd")), fds, "fds left open")
        self.assertLess(rss_kib() - rss, 16 << 10, "RSS grew by more than 16 MiB")
        # the model's parameters are private memory again and still train
        train(model, torch.optim.AdamW(model.parameters()), batches(1))


    def test_gradients_are_not_copied_as_the_interpreter_exits(self):
        # the finaliser at exit (a forked child that wrote a checkpoint, say) would copy every
        # gradient into private memory that no one reads after; close() copies them
        script = ("import torch, zenflow_bind._layout as L, zenflow_bind.optim as zt\n"
                  "own = L.Slot._own_grad\n"
                  "def told(self):\n"
                  "    print('copied', flush=True)\n"
                  "    own(self)\n"
                  "L.Slot._own_grad = told\n"
                  "net = torch.nn.Linear(64, 64)\n"
                  "opt = zt.AdamW(net.parameters(), threads=1)\n"
                  "net(torch.ones(2, 64)).sum().backward()\n"
                  "opt.step()\n"
                  "print('exiting', flush=True)\n"
                  "if __import__('sys').argv[1:] == ['close']:\n"
                  "    opt.close()\n")
        for how, want in ((["exit"], ["exiting"]), (["close"], ["exiting", "copied", "copied"])):
            out = subprocess.run([sys.executable, "-c", script, *how], capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.split(), want, how)

    def test_a_stopped_worker_goes_when_its_trainer_is_killed(self):
        # a trainer leading its own session (started with setsid, as a daemon), its worker
        # stopped alone (SIGSTOP): the kernel wakes no orphaned group there, and a stopped worker
        # never sees its trainer's pidfd
        script = ("import time, torch, zenflow_bind.optim as zt\n"
                  "opt = zt.AdamW(torch.nn.Linear(4, 4).parameters(), threads=1)\n"
                  "print(opt.worker.pid, flush=True)\n"
                  "time.sleep(120)\n")
        trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                   text=True, start_new_session=True)
        worker = int(trainer.stdout.readline())
        try:
            os.kill(worker, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while (proc_stat(worker) or ["?"])[0] != "T" and time.monotonic() < deadline:
                time.sleep(0.01)
            trainer.kill()
            trainer.wait()
            deadline = time.monotonic() + 10
            while alive(worker) and time.monotonic() < deadline:
                time.sleep(0.05)
            state = (proc_stat(worker) or ["gone"])[0]
            self.assertFalse(alive(worker), f"worker {worker} stayed in state {state}")
        finally:
            trainer.stdout.close()
            if alive(worker):
                os.kill(worker, signal.SIGKILL)

    def test_a_gradient_kept_after_close_stays_readable(self):
        """After a step p.grad is a view of the worker's buffer; close() (or dropping the
        optimizer) gives p a private gradient, and a reference the user kept reads what it
        held. The buffer is unmapped with the last view, or at close() if none is left."""
        x, y = batches(1)[0]
        for how in ("close", "drop"):
            with self.subTest(how=how):
                base = segments()  # (other tests' garbage collected first)
                model = mlp()
                opt = ours(model.parameters(), lr=1e-2, threads=1)
                for _ in range(2):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                kept = model[0].weight.grad
                self.assertTrue(any(kept.data_ptr() == g.data_ptr()
                                    for layout in opt._layouts for s in layout.slots
                                    for g in s.grads))  # a view of the buffer
                held, mapped = kept.clone(), segments()
                self.assertGreater(mapped, base)
                if how == "close":
                    opt.close()
                else:
                    del opt
                    gc.collect()
                self.assertIsNot(model[0].weight.grad, kept)
                self.assertTrue(torch.equal(kept, held))  # read, not a crash
                self.assertTrue(torch.equal(model[0].weight.grad, held))
                self.assertEqual(segments(), mapped)  # held by the view
                del kept
                self.assertEqual(segments(), base)
        base, model = segments(), mlp()
        with ours(model.parameters(), threads=1) as opt:  # no view kept: unmapped at close()
            train(model, opt, batches(1))
            model.zero_grad(set_to_none=True)
        self.assertEqual(segments(collect=False), base)


class Threads(unittest.TestCase):
    def test_a_second_thread_is_refused_before_it_changes_anything(self):
        a, b = mlp(), mlp()
        x, y = batches(1)[0]
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            for model in (a, b):
                torch.nn.functional.mse_loss(model(x), y).backward()
            errors = []
            gate = threading.Barrier(2)

            def step():
                gate.wait()
                try:
                    opt.step()
                except RuntimeError as e:
                    errors.append(e)
            os.kill(opt.worker.pid, signal.SIGSTOP)  # hold the first step in flight
            threads = [threading.Thread(target=step) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            os.kill(opt.worker.pid, signal.SIGCONT)
            for t in threads:
                t.join()
            self.assertEqual(len(errors), 1)
            self.assertIn("another thread", str(errors[0]))
            ref.step()  # one update, as the one step() that ran
            assert_close(self, a.parameters(), b.parameters())

    def test_a_call_refused_as_another_takes_or_leaves_the_optimizer_says_so(self):
        # between the other thread taking the lock and naming its call (or after it named none
        # on leaving) the refusal has no call to name
        with ours(mlp().parameters()) as opt:
            self.assertTrue(opt._busy.acquire(blocking=False))
            try:
                with self.assertRaisesRegex(RuntimeError, r"another thread is in a call of"):
                    opt.state_dict()
            finally:
                opt._busy.release()
            opt.state_dict()

    def test_a_handler_run_inside_a_step_is_refused(self):
        # a signal handler saving a checkpoint (SIGUSR1 on Slurm) runs on the thread in step():
        # reading the state, synchronize() or close() there would finish the step twice
        from unittest import mock
        a, b = mlp(), mlp()
        x, y = batches(1)[0]
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            train(a, opt, batches(1))
            train(b, ref, batches(1))
            for model in (a, b):
                torch.nn.functional.mse_loss(model(x), y).backward()
            errors, real = [], opt._worker.submit
            calls = (opt.state_dict, lambda: opt.state, opt.synchronize, opt.close,
                     lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}))

            def submit_and_handler(*args, **kwargs):
                real(*args, **kwargs)
                for call in calls:
                    try:
                        call()
                    except RuntimeError as e:
                        errors.append(str(e))

            with mock.patch.object(opt._worker, "submit", side_effect=submit_and_handler):
                opt.step()
            self.assertEqual(len(errors), len(calls), errors)
            self.assertTrue(all("this thread (a signal handler or a hook?) is in step()" in e
                                for e in errors), errors)
            ref.step()
            assert_close(self, a.parameters(), b.parameters())
            self.assertEqual(float(opt.state_dict()["state"][0]["step"]), 2.0)


class LoadStateDict(unittest.TestCase):
    def test_a_refused_state_dict_changes_nothing(self):
        a, data = mlp(), batches(6)
        with ours(groups_of(a), lr=1e-2) as opt:
            train(a, opt, data[:3])
            before = opt.state_dict()
            before = {"state": {i: {k: v.clone() for k, v in s.items()}
                                for i, s in before["state"].items()},
                      "groups": [dict(g) for g in before["param_groups"]]}
            params = [p.detach().clone() for p in a.parameters()]
            bad = opt.state_dict()
            bad["param_groups"][0]["lr"] = 0.5
            bad["state"][4] = {k: v.clone() for k, v in bad["state"][4].items()}
            bad["state"][4]["exp_avg"] = torch.zeros(7)  # wrong size, in the last group
            with self.assertRaisesRegex(ValueError, r"parameter 4.*exp_avg has shape \(7,\)"):
                opt.load_state_dict(bad)
            lost = copy.deepcopy(opt.state_dict())  # a group without its lr (an SGD's: betas)
            del lost["param_groups"][1]["lr"]
            with self.assertRaisesRegex(ValueError, "param group 1 of the state dict has no lr"):
                opt.load_state_dict(lost)
            transposed = copy.deepcopy(opt.state_dict())  # as many elements, scrambled
            transposed["state"][0]["exp_avg_sq"] = transposed["state"][0]["exp_avg_sq"].t()
            with self.assertRaisesRegex(ValueError, "parameter 0.*exp_avg_sq has shape"):
                opt.load_state_dict(transposed)
            missing = copy.deepcopy(opt.state_dict())  # its entries are opt.state's, as torch's
            del missing["state"][1]["exp_avg_sq"]
            with self.assertRaisesRegex(ValueError, "parameter 1.*no exp_avg_sq"):
                opt.load_state_dict(missing)
            after = opt.state_dict()
            self.assertEqual([g["lr"] for g in after["param_groups"]],
                             [g["lr"] for g in before["groups"]])
            self.assertEqual(sorted(after["state"]), sorted(before["state"]))
            for i, s in before["state"].items():
                for k, v in s.items():
                    self.assertTrue(torch.equal(after["state"][i][k], v), (i, k))
            assert_equal(self, a.parameters(), params)

    def test_ctrl_c_during_a_load_is_raised_once_every_group_has_it(self):
        from unittest import mock
        a, data = mlp(), batches(4)
        with ours(groups_of(a), lr=1e-2) as opt:
            train(a, opt, data[:1])
            saved = copy.deepcopy(opt.state_dict())
            train(a, opt, data[1:3])  # two steps past the checkpoint
            apply = opt._apply_group_state
            applied = []

            def interrupted(*args):  # Ctrl-C as the first group's state goes in
                if not applied:
                    os.kill(os.getpid(), signal.SIGINT)
                applied.append(apply(*args))

            with mock.patch.object(opt, "_apply_group_state", side_effect=interrupted), \
                    self.assertRaises(KeyboardInterrupt):
                opt.load_state_dict(saved)
            self.assertEqual(len(applied), len(opt.param_groups))
            after = opt.state_dict()
            self.assertEqual({float(s["step"]) for s in after["state"].values()}, {1.0})
            for i, state in saved["state"].items():
                for k, v in state.items():
                    self.assertTrue(torch.equal(after["state"][i][k], v), (i, k))


class BadInput(unittest.TestCase):
    def test_hyperparameters_must_be_numbers(self):
        a = mlp()
        for kw in ({"lr": "0.1"}, {"eps": None}, {"weight_decay": "0"}, {"betas": (0.9, "x")},
                   {"betas": 0.9}):
            with self.subTest(kw=kw), self.assertRaises(TypeError):
                ours(a.parameters(), **kw)
        with ours(a.parameters()) as opt:
            opt.param_groups[0]["lr"] = "0.1"  # a scheduler gone wrong: refused at the step
            torch.nn.functional.mse_loss(a(batches(1)[0][0]), batches(1)[0][1]).backward()
            with self.assertRaisesRegex(TypeError, "lr must be a number"):
                opt.step()

    def test_bad_step_arguments_are_refused_before_the_step(self):
        a = mlp()
        with ours(a.parameters()) as opt:
            before = [p.detach().clone() for p in a.parameters()]
            torch.nn.functional.mse_loss(a(batches(1)[0][0]), batches(1)[0][1]).backward()
            for scale, error in ((float("nan"), ValueError), (True, TypeError),
                                 ("2", TypeError)):
                with self.subTest(scale=scale), self.assertRaises(error):
                    opt.step(grad_scale=scale)
            assert_equal(self, a.parameters(), before)
            opt.step(grad_scale=1.0)
        for bad in (None, -1, float("inf")):
            with self.subTest(timeout_ms=bad), self.assertRaises((TypeError, ValueError)):
                ours(a.parameters(), timeout_ms=bad)

    def test_a_failed_add_param_group_leaves_the_groups_as_they_were(self):
        """A param group that fails while it is being added (its third bucket's registration,
        or after its layout is whole) leaves nothing behind: not in param_groups, and not in the
        worker, whose groups and memory are what they were; the optimizer then trains on, with a
        group added later, as torch's does."""
        from unittest import mock
        import zenflow_bind._layout as layout
        import zenflow_bind.worker as zw
        a, b = twins()
        first_a, first_b = list(a.parameters())[:2], list(b.parameters())[:2]
        rest_a, rest_b = list(a.parameters())[2:], list(b.parameters())[2:]
        big = [torch.nn.Parameter(torch.ones(1 << 20)) for _ in range(4)]  # 4 buckets, 32 MiB
        add_group = zw.Worker.add_group

        def third_fails(worker, *args, **kw):
            if len(worker.groups) == 1 + 2:
                raise ZenbindError(-4, "injected: no memory for the third bucket")
            return add_group(worker, *args, **kw)
        with ours(first_a, lr=1e-2, bucket_elements=1 << 20) as opt:
            ref = torch.optim.AdamW(first_b, lr=1e-2)
            train(a, opt, batches(1))
            train(b, ref, batches(1))
            worker = opt.worker
            before = worker.memory()
            removed = zw.Group.remove
            removals = []

            def second_removal_fails(group):
                removals.append(group)
                if len(removals) == 2:
                    raise KeyboardInterrupt  # a handler's, or Ctrl-C without a Python handler
                return removed(group)
            for what, patch in (
                    ("a bucket", mock.patch.object(zw.Worker, "add_group", third_fails)),
                    ("watch", mock.patch.object(layout.Slot, "watch",
                                                side_effect=RuntimeError("injected")))):
                with self.subTest(failing=what):
                    with patch, self.assertRaisesRegex(RuntimeError, "injected"):
                        opt.add_param_group({"params": big, "lr": 0.3})
                    self.assertEqual((len(opt.param_groups), len(opt._layouts)), (1, 1))
                    self.assertEqual(len(worker.groups), 1)
                    after = worker.memory()
                    for kind in ("numel", "params", "grads", "moments", "shm_reserved"):
                        self.assertEqual(after[kind], before[kind], kind)
                    # 16 MiB of moments and 8 of masters came and went (a failure left 24 MiB)
                    self.assertLess(after["worker_rss"], before["worker_rss"] + (8 << 20))
                    self.assertTrue(all(p.grad is None for p in big))
            # the undoing itself interrupted: param_groups and layouts still paired
            with mock.patch.object(layout.Slot, "watch", side_effect=RuntimeError("injected")), \
                    mock.patch.object(zw.Group, "remove", second_removal_fails), \
                    self.assertRaises(KeyboardInterrupt):
                opt.add_param_group({"params": big, "lr": 0.3})
            self.assertEqual((len(opt.param_groups), len(opt._layouts)), (1, 1))
            left = len(worker.groups)  # the groups the interrupted undoing left
            opt.add_param_group({"params": rest_a, "lr": 0.05})
            ref.add_param_group({"params": rest_b, "lr": 0.05})
            self.assertEqual(len(worker.groups), left + 1)
            train(a, opt, batches(3))
            train(b, ref, batches(3))
            assert_close(self, a.parameters(), b.parameters())

    def test_a_sparse_gradient_is_refused_and_close_still_frees_everything(self):
        """A sparse gradient (nn.Embedding(sparse=True)) is refused at step(), clearly, for both
        modes; close() then still gives every other gradient private memory and unmaps the
        worker's buffers (it raised on the sparse one and left them)."""
        for worker in (True, False):
            with self.subTest(worker=worker):
                base = segments()
                torch.manual_seed(0)
                emb = torch.nn.Embedding(10, 4, sparse=True)
                lin = torch.nn.Linear(4, 2)
                opt = zt.AdamW(list(lin.parameters()) + list(emb.parameters()), worker=worker)
                for _ in range(2):  # the second step finds the Linear's grads in the buffer
                    opt.zero_grad(set_to_none=False)
                    lin(emb(torch.tensor([1, 2, 3]))).sum().backward()
                    with self.assertRaisesRegex(RuntimeError, "sparse"):
                        opt.step()
                    emb.weight.grad = None
                    lin(emb.weight[:3].detach()).sum().backward()
                    opt.step()  # and without it, it steps
                opt.zero_grad(set_to_none=False)
                lin(emb(torch.tensor([4, 5]))).sum().backward()  # a sparse gradient again
                with self.assertRaisesRegex(RuntimeError, "sparse"):
                    opt.step()
                opt.close()
                # lin's gradients are no views of it any more
                self.assertEqual(segments(collect=False), base)
                self.assertTrue(emb.weight.grad.is_sparse)
                self.assertTrue(torch.isfinite(lin.weight.grad).all())

    def test_opt_state_is_not_reassigned(self):
        a = mlp()
        with ours(a.parameters()) as opt:
            train(a, opt, batches(1))
            for value in ({}, {next(a.parameters()): {}}):
                with self.assertRaisesRegex(TypeError, "load_state_dict"):
                    opt.state = value
            self.assertEqual(len(opt.state), len(list(a.parameters())))

    def test_a_subclass_cannot_drop_its_worker(self):
        class Mine(zt.AdamW):
            pass
        with self.assertRaisesRegex(TypeError, "Mine, a subclass of the worker's"):
            Mine(mlp().parameters(), worker=False)

    def test_a_parameter_given_another_shape_is_refused(self):
        a = mlp()
        with ours(a.parameters()) as opt:
            train(a, opt, batches(1))
            a[4].bias.data = torch.randn(3)  # was (4,)
            a[4].bias.grad = torch.randn(3)
            with self.assertRaisesRegex(ValueError, r"parameter 5 was \[4\] and is now \[3\]"):
                opt.step()
        # a load is refused whole, before any group changes
        b = mlp()
        with ours(groups_of(b), lr=1e-2) as opt:
            train(b, opt, batches(1))
            saved = copy.deepcopy(opt.state_dict())
            saved["param_groups"][0]["lr"] = 0.5
            before = [g["lr"] for g in opt.param_groups]
            b[4].bias.grad = None
            b[4].bias.data = torch.randn(3)
            with self.assertRaisesRegex(ValueError, r"was \[4\] and is now \[3\]"):
                opt.load_state_dict(saved)
            self.assertEqual([g["lr"] for g in opt.param_groups], before)

    def test_built_under_inference_mode_the_model_still_trains(self):
        a, b = mlp(), mlp()
        with torch.inference_mode():
            opt = ours(a.parameters(), lr=1e-2)
        with opt:
            self.assertFalse(any(p.is_inference() for p in a.parameters()))
            train(a, opt, batches(3))
            train(b, torch.optim.AdamW(b.parameters(), lr=1e-2), batches(3))
            assert_close(self, a.parameters(), b.parameters())

    def test_zero_element_parameters_are_stepped_as_torch(self):
        a, b = mlp(), mlp()
        empty_a, empty_b = torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.zeros(0))
        with ours([{"params": [empty_a]}, {"params": list(a.parameters())}], lr=1e-2) as opt:
            ref = torch.optim.AdamW([{"params": [empty_b]}, {"params": list(b.parameters())}],
                                    lr=1e-2)
            train(a, opt, batches(3))
            train(b, ref, batches(3))
            assert_close(self, a.parameters(), b.parameters())

    def test_one_parameter_in_two_optimizers_is_refused(self):
        a = mlp()
        with ours(a.parameters()):
            with self.assertRaisesRegex(ValueError, "parameter 0 .*another"):
                ours(a.parameters())


if __name__ == "__main__":
    unittest.main()
