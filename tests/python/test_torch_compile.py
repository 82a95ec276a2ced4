"""zenflow_bind under torch.compile (torch >= 2.1; skips before): a compiled function that steps
the optimizer, or a compiled training step around it, runs the step eagerly, with one clean graph
break and no warning, and gives the bits of the same run uncompiled.

Dynamo's backend here is "eager" (its graphs run as traced, without inductor, whose CPU code
needs a C++ toolchain and torch's headers); the graph breaks are dynamo's, whatever the backend."""

import contextlib
import functools
import os
import unittest
import warnings

import torch

from torch_cases import THREADS, assert_equal, batches, mlp
import zenflow_bind.optim as zt
from zenflow_bind.functional import adamw_

COMPILER = getattr(getattr(torch, "compiler", None), "disable", None) is not None


def ours(model, worker):
    kw = {"threads": THREADS} if worker else {}
    return zt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, worker=worker, **kw)


@unittest.skipUnless(COMPILER, f"torch {torch.__version__} has no torch.compiler")
class Compiled(unittest.TestCase):
    def compiled_run(self, body, *args):
        """body(*args, compiled=True): what it returns, the files of the frames dynamo took to
        compile, and the warnings raised."""
        from torch._dynamo import convert_frame
        torch._dynamo.reset()
        convert_frame.input_codes.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = body(*args, compiled=True)
        codes = (ref() for ref in convert_frame.input_codes.seen)
        files = {code.co_filename for code in codes if code is not None}
        return out, files, [str(w.message) for w in caught]

    def assert_untraced(self, files, caught):
        """No frame of the package went to dynamo (each of our calls is one graph break in the
        caller's frame), and no warning."""
        package = os.path.dirname(zt.__file__)
        self.assertEqual(sorted(f for f in files if f.startswith(package)), [])
        self.assertIn(__file__, files)  # what the test compiled was compiled
        self.assertEqual(caught, [])

    def run_steps(self, make, compiled, whole):
        """Four steps of an MLP: the step alone compiled, or the whole training step."""
        model = mlp()
        with contextlib.closing(make(model)) as opt:
            def train_step(x, y):
                loss = torch.nn.functional.mse_loss(model(x), y)
                if whole == "during" and hasattr(opt, "step_during_backward"):
                    with opt.step_during_backward():
                        loss.backward()
                else:
                    loss.backward()
                opt.step()

            def step():
                opt.step()
            body = train_step if whole else step
            fn = torch.compile(body, backend="eager") if compiled else body
            for x, y in batches(4):
                opt.zero_grad()
                if whole:
                    fn(x, y)
                else:
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    fn()
        return [p.detach().clone() for p in model.parameters()]

    def check(self, worker, whole):
        def run(compiled=False):
            return self.run_steps(functools.partial(ours, worker=worker), compiled, whole)
        eager = run()
        compiled, files, caught = self.compiled_run(run)
        self.assert_untraced(files, caught)
        assert_equal(self, compiled, eager)
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(compiled, mlp().parameters())))

    def test_step_in_the_worker(self):
        self.check(worker=True, whole=False)

    def test_step_in_process(self):
        self.check(worker=False, whole=False)

    def test_training_step_in_the_worker(self):
        self.check(worker=True, whole=True)

    def test_training_step_in_process(self):
        self.check(worker=False, whole=True)

    def test_steps_during_backward_in_the_worker(self):
        self.check(worker=True, whole="during")

    def test_steps_during_backward_in_process(self):
        self.check(worker=False, whole="during")

    def test_functional(self):
        torch.manual_seed(0)
        tensors = [torch.randn(1000) for _ in range(3)] + [torch.rand(1000)]
        grads_at = [torch.randn(1000) for _ in range(3)]

        def steps(compiled=False):
            p, g, m, v = (t.clone() for t in tensors)

            def step(i):  # a user's function around it (compiling adamw_ itself traces it)
                adamw_([p], [g], [m], [v], step=i, lr=1e-2, weight_decay=0.1)
            fn = torch.compile(step, backend="eager") if compiled else step
            for i, grad in enumerate(grads_at, 1):
                g.copy_(grad)
                fn(i)
            return [p, m, v]
        eager = steps()
        compiled, files, caught = self.compiled_run(steps)
        self.assert_untraced(files, caught)
        assert_equal(self, compiled, eager)

if __name__ == "__main__":
    unittest.main()
