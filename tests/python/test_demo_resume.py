"""contrib/demo/train_transformer.py, stopped at its checkpoint and resumed in a new optimizer
(a new worker), ends with the same parameters, bit for bit, as the same script run straight
through. Both runs write the checkpoint at the same step, so both synchronize the overlapped
worker there: what differs is only whether the model and the optimizer came back from disk."""

import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "demo"))
import train_transformer  # noqa: E402

SMALL = ["--steps", "8", "--save-at", "4", "--width", "32", "--layers", "1", "--heads", "2",
         "--seq", "8", "--batch", "2", "--vocab", "16", "--quiet"]


def run(optimizer, *extra):
    model = train_transformer.main(SMALL + ["--optimizer", optimizer, *extra])
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Resume(unittest.TestCase):
    def setUp(self):
        # one intra-op thread: the same reduction order in every run
        torch.set_num_threads(1)
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def check(self, optimizer):
        straight = run(optimizer, "--checkpoint", os.path.join(self.dir.name, "straight.pt"))
        ck = os.path.join(self.dir.name, "stopped.pt")
        run(optimizer, "--checkpoint", ck, "--stop-at-save")
        half = torch.load(ck)["model"]
        resumed = run(optimizer, "--resume", ck)
        self.assertTrue(any(not torch.equal(v, half[k]) for k, v in straight.items()),
                        "nothing moved after the checkpoint: the test would prove nothing")
        for name, value in straight.items():
            self.assertTrue(torch.equal(value, resumed[name]),
                            f"{optimizer}: {name} differs after resuming, max |diff| "
                            f"{(value - resumed[name]).abs().max().item():.3g}")

    def test_zenflow_overlap(self):
        self.check("zenflow")

    def test_torch(self):
        self.check("torch")


if __name__ == "__main__":
    unittest.main()
