"""The demo (contrib/demo): train_gpt.py resumed from its DCP checkpoint ends bit for bit where a
run that never stopped does, for zenflow_bind.optim.AdamW and for torch's fused AdamW, and
report.py's figures are the logs', not constants. Needs transformers and torch >= 2.4 (fused CPU
AdamW, DCP without a process group): the forky root has them (roots_forky_python); elsewhere
this skips."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

import torch

DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "contrib", "demo")
sys.path.insert(0, DEMO)

try:
    import transformers  # noqa: F401 (train_gpt.py builds its model with it)
    import torch.distributed.checkpoint  # noqa: F401
    missing = None if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 4) else \
        f"torch {torch.__version__} has no fused CPU AdamW"
except (ImportError, ValueError) as e:
    missing = f"no transformers or DCP here ({e})"

if missing is None:
    import report
    import train_gpt

# --deterministic: bit-identical resumes on a GPU (bench/gpu_run.sh test) need it; on a CPU it
# must change nothing but run
TINY = ["--width", "64", "--layers", "2", "--heads", "2", "--seq", "16", "--batch", "2",
        "--quiet", "--deterministic"]


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@unittest.skipIf(missing, missing)
class Demo(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def train(self, *args):
        return train_gpt.main(TINY + list(args))

    def test_resume_is_bit_identical(self):
        for optimizer in ("zenflow", "torch-fused"):
            with self.subTest(optimizer=optimizer):
                common = ["--optimizer", optimizer, "--steps", "6"]
                straight = self.train(*common, "--log", self.path(f"{optimizer}-straight"))
                ck = self.path(f"{optimizer}.dcp")
                log = self.path(optimizer)
                self.train(*common, "--save-at", "3", "--stop-at-save", "--checkpoint", ck,
                           "--log", log)
                resumed = self.train(*common, "--save-at", "3", "--resume", ck, "--log", log)
                for a, b in zip(straight.parameters(), resumed.parameters()):
                    self.assertTrue(torch.equal(a, b))
                steps = [r for r in lines(log) if "step" in r]
                self.assertEqual([r["step"] for r in steps], [1, 2, 3, 4, 5, 6])
                whole = [r for r in lines(self.path(f"{optimizer}-straight")) if "segment" in r]
                self.assertEqual(lines(log)[-1]["params_sha256"], whole[0]["params_sha256"])
                self.assertEqual(lines(log)[-1]["eval_loss"], whole[0]["eval_loss"])
                text, same = report.resume_check(
                    [("x", steps, [r for r in lines(log) if "segment" in r])],
                    self.path(f"{optimizer}-straight"))
                self.assertTrue(same, text)
                self.assertIn("after step 3", text)
                self.assertIn("in a new srun step;", text)
                text, _ = report.resume_check(
                    [("x", steps, [r for r in lines(log) if "segment" in r])],
                    self.path(f"{optimizer}-straight"), resumed_in="a new process")
                self.assertIn("in a new process;", text)

    def test_a_changed_step_shows(self):
        # the resume check compares weights: a run that trained differently after the
        # checkpoint is reported as different
        common = ["--optimizer", "torch-fused", "--steps", "4"]
        self.train(*common, "--log", self.path("straight"))
        ck = self.path("ck.dcp")
        self.train(*common, "--save-at", "2", "--stop-at-save", "--checkpoint", ck,
                   "--log", self.path("run"))
        self.train(*common, "--resume", ck, "--log", self.path("run"), "--seed", "1")  # data
        records = lines(self.path("run"))
        text, same = report.resume_check(
            [("x", [r for r in records if "step" in r], [r for r in records if "segment" in r])],
            self.path("straight"))
        self.assertFalse(same)
        self.assertIn("DIFFER", text)

    def test_figures_come_from_the_logs(self):
        self.train("--optimizer", "torch-fused", "--steps", "4", "--log", self.path("a"))
        records = lines(self.path("a"))
        steps = [r for r in records if "step" in r]
        segments = [r for r in records if "segment" in r]
        # the held-out loss is the model's
        self.assertGreater(segments[0]["eval_loss"], 0)
        self.assertEqual(len({r["step_ms"] for r in steps}), len(steps))  # measured, not fixed
        first = report.row("a", steps, segments)
        # twice the step time in the log: half the tokens per second in the table
        slower = [dict(r, step_ms=2 * r["step_ms"]) for r in steps]
        second = report.row("a", slower, segments)
        self.assertAlmostEqual(float(second[1]) / float(first[1]), 0.5, delta=0.01)
        self.assertAlmostEqual(float(second[3]), 2 * float(first[3]), delta=0.11)
        # the page faults of each step are counted, and the table shows their median
        self.assertTrue(all(isinstance(r["faults"], int) and r["faults"] >= 0 for r in steps))
        faulting = [dict(r, faults=1000 + r["step"]) for r in steps]  # steps 2-4 counted
        at = report.HEADER.index("page faults per step")
        self.assertEqual(report.row("a", faulting, segments)[at], "1003")
        # the verdict quotes bench/README.md's GPU table when the first run is slower
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            report.verdict([("ours", slower, segments), ("torch", steps, segments)],
                           os.path.join(DEMO, "..", "..", "bench", "README.md"))
        self.assertIn("2.00x the step time of torch", out.getvalue())
        self.assertIn("| tokens | gpu-fused | zenflow", out.getvalue())
        self.assertIn("H100", out.getvalue())

    def test_host_bytes_are_the_hosts(self):
        # parameters, gradients and state in host memory count; elsewhere (here: meta, on a GPU
        # machine: CUDA) they do not
        for device, expected in (("cpu", 4 * (16 + 4) * 4), ("meta", 0)):
            model = torch.nn.Linear(4, 4, device=device)
            opt = torch.optim.AdamW(model.parameters())
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
                opt.state[p] = {"exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p), "step": torch.tensor(0.0)}
            # and each parameter's step, a 0-d fp32 tensor that torch keeps on the host
            self.assertEqual(train_gpt.host_bytes(model, opt), expected + 2 * 4)

    def test_running_mean(self):
        self.assertEqual(report.running_mean([2.0, 4.0, 6.0, 8.0], 2), [2.0, 3.0, 5.0, 7.0])
        self.assertEqual(report.running_mean([1.0] * 5, 10), [1.0] * 5)


if __name__ == "__main__":
    unittest.main()
