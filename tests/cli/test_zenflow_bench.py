"""zenflow-bench end to end: adam's JSON contract and the bytes each configuration moves, ipc's and
worker's JSON contracts (ZENFLOW_OPTIMIZER names the worker), and usage errors (exit status 2
and a message naming the option) and run failures (exit status 1)."""
import json
import os
import statistics
import subprocess
import sys
import unittest

BENCH = sys.argv.pop(1)
with open(BENCH, "rb") as _elf:  # e_machine 183: built for aarch64 (the cross build, under qemu)
    AARCH64 = int.from_bytes(_elf.read(20)[18:20], "little") == 183
N = 100_003  # not a multiple of 16 or 32: the kernel's and the roofline's tails run


def run(*args):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=120)


def assert_machine(test, d):
    """Every subcommand says where and when it measured: the CPU model (the first "model name" of
    /proc/cpuinfo), the transparent huge page mode (the bracketed word of the kernel's setting) and
    the 1-minute load average at the start and at the end of the run."""
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    test.assertEqual(d["cpu"], names[0] if names else "unknown")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = [w[1:-1] for w in f.read().split() if w.startswith("[")][0]
    except OSError:
        thp = "unknown"
    test.assertEqual(d["thp"], thp)
    for key in ("load_start", "load_end"):
        test.assertIsInstance(d[key], float)
        test.assertGreaterEqual(d[key], 0)


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
        self.assertEqual(set(forms), {"simd", "lines", "nt"})
        self.assertAlmostEqual(d["roofline_gb_per_s"], forms[d["roofline_form"]],
                               delta=1e-3 * d["roofline_gb_per_s"])
        self.assertEqual(d["roofline_form"], max(forms, key=forms.get))
        self.assertEqual(d["bytes_per_step"], 28 * N)
        self.assertGreater(d["seconds"], 0)
        self.assertGreater(d["roofline_seconds"], 0)
        self.assertAlmostEqual(d["gb_per_s"], d["bytes_per_step"] / d["seconds"] / 1e9,
                               delta=1e-3 * d["gb_per_s"])
        self.assertAlmostEqual(d["ratio"], d["gb_per_s"] / d["roofline_gb_per_s"], delta=1e-3)
        # The prefetched pass is a diagnostic beside the roofline, never one of its forms.
        self.assertGreater(d["prefetched_pass_gb_per_s"], 0)
        self.assertAlmostEqual(d["ratio_to_prefetched_pass"],
                               d["gb_per_s"] / d["prefetched_pass_gb_per_s"], delta=1e-3)
        assert_machine(self, d)

    def test_bytes_follow_the_configuration(self):
        d = adam("--grad", "bf16", "--copy-out", "fp16", "--stale")
        self.assertEqual((d["grad"], d["copy_out"], d["stale"]), ("bf16", "fp16", True))
        self.assertEqual(d["bytes_per_step"], (24 + 2 + 2 + 4) * N)

    def test_every_isa_this_cpu_has(self):
        isas = ["scalar", "neon", "sve"] if AARCH64 else ["scalar", "avx2", "avx512"]
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

    def test_versus(self):
        # A second configuration runs beside the kernel; what it does not set is the kernel's.
        self.assertEqual(adam()["prefetch"], "auto")  # chosen at run time, on larger steps
        d = adam("--vs-prefetch", "off")
        self.assertEqual((d["vs"]["isa"], d["vs"]["prefetch"]), (d["isa"], "off"))
        d = adam("--prefetch", "l1", "--vs-prefetch", "l2")
        self.assertEqual((d["prefetch"], d["vs"]["prefetch"]), ("l1", "l2"))
        d = adam("--isa", "scalar", "--prefetch", "off", "--vs-isa", adam()["isa"])
        self.assertEqual((d["isa"], d["prefetch"], d["stores"]), ("scalar", "off", "cached"))
        self.assertEqual(d["vs"]["prefetch"], "off")
        for v in (d["vs"]["seconds"], d["vs"]["time_ratio"]):
            self.assertGreater(v, 0)
        self.assertNotIn("vs", adam())
        r = run("adam", "--elements", "4096", "--steps", "10", "--vs-prefetch", "off")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"(?m)^vs +[\d.]+ s/step +\(isa \w+, prefetch off\)$")
        self.assertRegex(r.stdout, r"(?m)^time +\d+\.\d+ +kernel/vs")

    def test_table(self):
        r = run("adam", "--elements", "4096", "--steps", "10")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"(?m)^ratio +\d+\.\d+$")
        self.assertRegex(r.stdout, r"(?m)^machine +CPU .+, load [\d.]+ at the start, "
                                   r"[\d.]+ at the end$")
        self.assertRegex(r.stdout, r"roofline .*\(plain (simd|lines|nt) pass; "
                                   r"GB/s simd [\d.]+, lines [\d.]+, nt [\d.]+\)")
        self.assertRegex(r.stdout, r"(?m)^prefetch +[\d.]+ s/step +[\d.]+ GB/s +\(diagnostic: "
                                   r".*; kernel \d+\.\d+ of it\)$")


def bench_json(*args, cmd=None):
    r = subprocess.run([*(cmd or []), BENCH, *args, "--json"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


class IpcAndWorker(unittest.TestCase):
    def test_ipc_json(self):
        d = bench_json("ipc", "--iterations", "1000")
        self.assertEqual(set(d), {"iterations", "trainer_cpu", "worker_cpu", "spin_us", "p50_us",
                                  "p99_us", "min_us", "futex_p50_us", "futex_p99_us", "cpu",
                                  "thp", "load_start", "load_end"})
        assert_machine(self, d)
        allowed = os.sched_getaffinity(0)
        # this process on its first allowed CPU, the worker on its last, the default spin
        self.assertEqual((d["iterations"], d["trainer_cpu"], d["worker_cpu"], d["spin_us"]),
                         (1000, min(allowed), max(allowed), 50))
        self.assertTrue(0 < d["min_us"] <= d["p50_us"] <= d["p99_us"], d)
        self.assertTrue(0 < d["futex_p50_us"] <= d["futex_p99_us"], d)

    def test_worker_json(self):
        keys = {"elements", "grad", "copy", "stale", "threads", "isa", "omp_wait_policy",
                "iterations", "worker_step_s", "worker_own_step_s", "inprocess_step_s", "overhead_ratio",
                "overhead_ratios", "bytes_per_param",
                "bytes_per_param_layout", "worker_rss", "trainer_rss_anon", "worker_rss_growth",
                "skip_step_s", "skip_ratio", "skip_ratios", "clip_step_s", "clip_ratio",
                "clip_ratios", "cpu", "thp", "load_start", "load_end"}
        # Unless told otherwise, the in-process side waits as the worker's team does: passively.
        d = bench_json("worker", "--elements", "1000000", "--iterations", "3",
                       cmd=["env", "-u", "OMP_WAIT_POLICY"])
        self.assertEqual(set(d), keys)
        self.assertEqual(d["omp_wait_policy"], "passive")
        assert_machine(self, d)
        self.assertEqual((d["elements"], d["grad"], d["copy"], d["stale"], d["iterations"]),
                         (1000000, "fp32", "none", False, 3))
        self.assertEqual(d["threads"], len(os.sched_getaffinity(0)))  # one per allowed CPU
        self.assertEqual(d["bytes_per_param_layout"], 4 + 2 * 4 + 8)
        for step in ("worker_step_s", "inprocess_step_s", "skip_step_s", "clip_step_s"):
            self.assertGreater(d[step], 0)
        # each ratio is the median of the iterations' own ratios, which the JSON lists in order
        for ratio in ("overhead_ratio", "skip_ratio", "clip_ratio"):
            each = d[ratio + "s"]
            self.assertEqual(len(each), 3)
            self.assertTrue(all(r > 0 for r in each), d)
            self.assertAlmostEqual(d[ratio], statistics.median(each), delta=1e-4)
        # the worker's own time is part of the round trip the trainer sees
        self.assertTrue(0 < d["worker_own_step_s"] <= d["worker_step_s"], d)
        self.assertGreater(d["worker_rss"], 0)
        # master + 2 bf16 gradient buffers + moments + bf16 copy-out + stale
        d = bench_json("worker", "--elements", "100000", "--iterations", "3", "--grad", "bf16",
                       "--copy-out", "bf16", "--stale", "--threads", "1",
                       cmd=["env", "OMP_WAIT_POLICY=active"])
        self.assertEqual((d["grad"], d["copy"], d["stale"], d["threads"]), ("bf16", "bf16", True, 1))
        self.assertEqual(d["omp_wait_policy"], "active")
        self.assertEqual(d["bytes_per_param_layout"], 4 + 2 * 2 + 8 + 2 + 4)

    def test_run_failures_exit_1(self):
        cpu = str(min(os.sched_getaffinity(0)))
        r = subprocess.run(["taskset", "-c", cpu, BENCH, "ipc", "--iterations", "100"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("needs two CPUs, this process may use 1", r.stderr)
        r = subprocess.run([BENCH, "worker", "--elements", "1000"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "ZENFLOW_OPTIMIZER": "/nonexistent/w"})
        self.assertEqual(r.returncode, 1, r.stderr)
        # qemu-user's posix_spawn cannot report the exec's error
        if not os.environ.get("ZB_TEST_QEMU_USER"):
            self.assertIn("cannot start the optimizer worker /nonexistent/w", r.stderr)


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
        self.assert_usage(["ipc", "--iterations", "5"], "--iterations takes 10 to 100000000")
        self.assert_usage(["worker"], "--elements N is required")
        # each value read whole and in range (-1 once ran as 2^64-1 elements, and crashed)
        for args, message in ((["--elements", "-1"], "--elements wants an integer"),
                              (["--elements", "1e5"], "not '1e5'"),
                              (["--elements", "10", "--iterations", "abc"], "--iterations wants"),
                              (["--elements", "10", "--iterations", "0"], "--iterations wants"),
                              (["--elements", "10", "--threads", "0"], "--threads wants"),
                              (["--copy-out", "fp32", "--elements", "10"],
                               "--copy-out wants bf16 or fp16, not 'fp32'"),
                              (["--elements", "10", "--grad", "fp64"], "--grad wants"),
                              (["--elements", "10", "--bogus", "1"], "unknown option: '--bogus'"),
                              (["--elements"], "missing value: '--elements'")):
            self.assert_usage(["worker", *args], message)
        self.assert_usage(["adam"], "--elements is required")
        self.assert_usage(["adam", "--elements", "0"], "--elements wants an integer")
        self.assert_usage(["adam", "--elements", "-5"], "--elements wants an integer")
        self.assert_usage(["adam", "--elements", "10", "--grad", "fp64"],
                          "--grad wants fp32, bf16 or fp16, not 'fp64'")
        self.assert_usage(["adam", "--elements", "10", "--copy-out", "fp32"],
                          "--copy-out wants none, bf16 or fp16")
        self.assert_usage(["adam", "--elements", "10", "--steps", "9"], "--steps wants")
        self.assert_usage(["adam", "--elements", "10", "--isa", "mmx"], "--isa wants")
        other = "avx2" if AARCH64 else "neon"
        self.assert_usage(["adam", "--elements", "10", "--isa", other],
                          f"this build or CPU does not support --isa {other}")
        self.assert_usage(["adam", "--elements", "10", "--stores", "nt"], "--stores wants")
        self.assert_usage(["adam", "--elements", "10", "--vs-isa", "sse"], "--vs-isa wants")
        self.assert_usage(["adam", "--elements", "10", "--prefetch", "512"],
                          "--prefetch wants off, l1, l2 or auto, not '512'")
        self.assert_usage(["adam", "--elements", "10", "--vs-prefetch", "yes"],
                          "--vs-prefetch wants off, l1, l2 or auto")
        self.assert_usage(["adam", "--elements", "10", "--bogus"], "'--bogus'")
        self.assert_usage(["adam", "--elements"], "missing value: '--elements'")
        cpus = len(os.sched_getaffinity(0))
        for sub in ("adam", "worker"):
            self.assert_usage([sub, "--elements", "10", "--threads", str(cpus + 1)],
                              f"only {cpus} CPUs in the affinity")

    def test_openmp_binding_is_refused(self):
        # libgomp pins the process to one place before main() where these are set: every
        # figure would be that place's
        base = {k: v for k, v in os.environ.items()
                if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")}
        for var, value in (("OMP_PROC_BIND", "true"), ("OMP_PLACES", "cores"),
                           ("GOMP_CPU_AFFINITY", "0")):
            for sub in ("adam", "ipc", "worker"):
                r = subprocess.run([BENCH, sub, "--elements", "10"] if sub != "ipc" else
                                   [BENCH, sub], capture_output=True, text=True, timeout=60,
                                   env={**base, var: value})
                self.assertEqual(r.returncode, 1, (var, sub, r.stderr))
                self.assertIn("env -u OMP_PROC_BIND", r.stderr)

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for sub in ("adam", "ipc", "worker"):
            self.assertRegex(r.stdout, rf"(?m)^  {sub} ")


if __name__ == "__main__":
    unittest.main(verbosity=2)
