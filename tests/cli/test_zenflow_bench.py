"""zenflow-bench adam end to end: the JSON contract, the bytes each configuration moves, and
usage errors (exit status 2 and a message naming the option)."""
import json
import os
import subprocess
import sys
import unittest

BENCH = sys.argv.pop(1)
N = 100_003  # not a multiple of 16 or 32: the kernel's and the roofline's tails run


def run(*args):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=120)


def adam(*args):
    r = run("adam", "--elements", str(N), "--steps", "10", "--json", *args)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


class Adam(unittest.TestCase):
    def test_json_contract(self):
        d = adam()
        for key in ("seconds", "gelem_per_s", "gb_per_s", "roofline_seconds",
                    "roofline_gb_per_s", "roofline_form", "ratio"):
            self.assertIn(key, d)
        self.assertEqual((d["elements"], d["threads"], d["steps"]), (N, 1, 10))
        self.assertEqual((d["grad"], d["copy_out"], d["stale"]), ("fp32", "none", False))
        forms = d["roofline_forms_gb_per_s"]
        self.assertEqual(set(forms), {"simd", "lines"})
        self.assertAlmostEqual(d["roofline_gb_per_s"], forms[d["roofline_form"]],
                               delta=1e-3 * d["roofline_gb_per_s"])
        self.assertEqual(d["roofline_form"], max(forms, key=forms.get))
        self.assertEqual(d["bytes_per_step"], 28 * N)
        self.assertGreater(d["seconds"], 0)
        self.assertGreater(d["roofline_seconds"], 0)
        self.assertAlmostEqual(d["gb_per_s"], d["bytes_per_step"] / d["seconds"] / 1e9,
                               delta=1e-3 * d["gb_per_s"])
        self.assertAlmostEqual(d["ratio"], d["gb_per_s"] / d["roofline_gb_per_s"], delta=1e-3)

    def test_bytes_follow_the_configuration(self):
        d = adam("--grad", "bf16", "--copy-out", "fp16", "--stale")
        self.assertEqual((d["grad"], d["copy_out"], d["stale"]), ("bf16", "fp16", True))
        self.assertEqual(d["bytes_per_step"], (24 + 2 + 2 + 4) * N)

    def test_every_isa_this_cpu_has(self):
        isas = ["scalar", "avx2", "avx512"]
        best = adam()["isa"]
        for isa in isas[: isas.index(best) + 1]:
            self.assertEqual(adam("--isa", isa)["isa"], isa)

    def test_stores(self):
        # Small steps stay in the cache unless streaming is asked for; with nothing written only,
        # every store is a plain one.
        self.assertEqual(adam("--stale")["stores"], "cached")
        self.assertEqual(adam("--stale", "--stores", "streaming")["stores"], "streaming")
        self.assertEqual(adam("--copy-out", "bf16", "--stores", "streaming")["stores"], "streaming")
        self.assertEqual(adam("--stores", "streaming")["stores"], "cached")

    def test_table(self):
        r = run("adam", "--elements", "4096", "--steps", "10")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"(?m)^ratio +\d+\.\d+$")
        self.assertRegex(r.stdout, r"roofline .*\(plain (simd|lines) pass; "
                                   r"GB/s simd [\d.]+, lines [\d.]+\)")


class Errors(unittest.TestCase):
    def assert_usage(self, args, message):
        r = run(*args)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(message, r.stderr)

    def test_usage(self):
        for sub in ("adam", "ipc", "worker"):
            r = subprocess.run([BENCH, sub, "--help"], capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(f"usage: zenflow-bench {sub}"), r.stdout)
        self.assert_usage([], "usage: zenflow-bench")
        self.assert_usage(["frobnicate"], "unknown subcommand 'frobnicate'")
        self.assert_usage(["adam"], "--elements is required")
        self.assert_usage(["adam", "--elements", "0"], "--elements wants an integer")
        self.assert_usage(["adam", "--elements", "-5"], "--elements wants an integer")
        self.assert_usage(["adam", "--elements", "10", "--grad", "fp64"],
                          "--grad wants fp32, bf16 or fp16, not 'fp64'")
        self.assert_usage(["adam", "--elements", "10", "--copy-out", "fp32"],
                          "--copy-out wants none, bf16 or fp16")
        self.assert_usage(["adam", "--elements", "10", "--steps", "9"], "--steps wants")
        self.assert_usage(["adam", "--elements", "10", "--isa", "neon"], "--isa wants")
        self.assert_usage(["adam", "--elements", "10", "--stores", "nt"], "--stores wants")
        self.assert_usage(["adam", "--elements", "10", "--bogus"], "'--bogus'")
        self.assert_usage(["adam", "--elements"], "missing value: '--elements'")
        cpus = len(os.sched_getaffinity(0))
        self.assert_usage(["adam", "--elements", "10", "--threads", str(cpus + 1)],
                          f"only {cpus} CPUs in the affinity")

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for sub in ("adam", "ipc", "worker"):
            self.assertRegex(r.stdout, rf"(?m)^  {sub} ")


if __name__ == "__main__":
    unittest.main(verbosity=2)
