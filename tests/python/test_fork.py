"""zenflow_bind.optim.AdamW across os.fork(), as a DataLoader worker or a user's multiprocessing
forks a training process: the child reads the model as it was, but whatever it does to the
parameters, their gradients or the optimizer (p.zero_(), a backward, opt.step()), the parent's
stay as they were, and the parent trains on as torch.optim.AdamW does."""

import os
import sys
import traceback
import unittest

import torch

from torch_cases import assert_close, batches, ours, train, twins
from zenflow_bind import ZenbindError


def snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    return params, grads, state


def loss_of(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def in_child(model, opt, batch, params_before):
    """What the child does; 0 if every check held, else the number of the one that failed."""
    torch.set_num_threads(1)  # as a DataLoader worker: no intra-op pool inherited across fork
    if params_before is not None:
        # it reads the parent's parameters as they were, without a step in flight
        if not all(torch.equal(p.detach(), v) for p, v in zip(model.parameters(), params_before)):
            return 10
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    if any(p.detach().abs().sum() != 0 for p in model.parameters()):
        return 11
    try:
        loss_of(model, batch).backward()  # into .grad, the gradient buffer's views
    except RuntimeError as e:
        # torch >= 2 refuses autograd in a child forked after the parent used it; write into
        # .grad in place as a backward would
        if "fork" not in str(e):
            raise
        for p in model.parameters():
            p.grad.add_(1.0)
    try:
        opt.step()
    except ZenbindError as e:
        if e.status != "EINVAL" or f"belongs to process {os.getppid()}" not in str(e):
            sys.stderr.write(f"child: step() raised {e}\n")
            return 13
    else:
        return 12
    grads = [p.grad.clone() for p in model.parameters()]
    try:
        opt.close()  # the child's copies go; the parent's step in flight stays the parent's
    except Exception as e:
        sys.stderr.write(f"child: close() raised {e}\n")
        return 14
    if not all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads)):
        return 15
    return 0


def train_synchronized(model, opt, data):
    """Overlap mode trained as torch trains (each update in before the next forward), but for
    the last step, left in flight."""
    for i, batch in enumerate(data):
        opt.zero_grad()
        loss_of(model, batch).backward()
        opt.step()
        if i + 1 < len(data):
            opt.synchronize()


def fork(model, opt, batch, params_before):
    """Runs in_child in a forked child; returns its wait status once it has exited. The parent
    checks its own model first: that is what must never change."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = in_child(model, opt, batch, params_before)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def check_child(test, status):
    test.assertTrue(os.WIFEXITED(status), f"child ended with {status:#x}")
    test.assertEqual(os.WEXITSTATUS(status), 0, "a check in the child failed (see in_child)")


class Fork(unittest.TestCase):
    def test_child_cannot_change_the_parent(self):
        data = batches(8)
        a, b = twins()
        ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
        with ours(a.parameters(), lr=1e-2) as opt:
            train(a, opt, data[:3])
            train(b, ref, data[:3])
            before = snapshot(a, opt)
            self.assertTrue(before[2])  # the optimizer has state to lose
            status = fork(a, opt, data[3], before[0])
            after = snapshot(a, opt)
            for x, y in zip(before[0], after[0]):
                self.assertTrue(torch.equal(x, y), "the child changed the parent's parameters")
            for x, y in zip(before[1], after[1]):
                self.assertTrue(torch.equal(x, y), "the child changed the parent's gradients")
            self.assertEqual(before[2].keys(), after[2].keys())
            for i, s in before[2].items():
                for k, v in s.items():
                    self.assertTrue(torch.equal(v, after[2][i][k]), f"state {i} {k} changed")
            check_child(self, status)
            # and the parent trains on as torch does
            train(a, opt, data[3:])
            train(b, ref, data[3:])
            assert_close(self, a.parameters(), b.parameters())

    def test_child_forked_with_a_step_in_flight(self):
        # overlap: step() returns with the worker still writing the parameters
        data = batches(8)
        a, b = twins()
        ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
        with ours(a.parameters(), lr=1e-2, overlap=True) as opt:
            train_synchronized(a, opt, data[:3])
            train(b, ref, data[:3])
            status = fork(a, opt, data[3], None)
            opt.synchronize()
            assert_close(self, a.parameters(), b.parameters())
            for p, q in zip(a.parameters(), b.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
            ours_state, ref_state = opt.state_dict()["state"], ref.state_dict()["state"]
            for i, s in ref_state.items():
                for k in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(ours_state[i][k], s[k], rtol=1e-5, atol=1e-6)
                self.assertEqual(float(ours_state[i]["step"]), float(s["step"]))
            check_child(self, status)
            train_synchronized(a, opt, data[3:])
            train(b, ref, data[3:])
            opt.synchronize()
            assert_close(self, a.parameters(), b.parameters())


if __name__ == "__main__":
    unittest.main()
