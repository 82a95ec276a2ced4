"""The zenbind CLI end to end: plan --json on the seed layouts, the table, show, and errors."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ZENBIND = sys.argv.pop(1)
SEED = "pack:2 [numa] core:16 pu:2(indexes=core:pack)"


def run(*args):
    return subprocess.run([ZENBIND, *args], capture_output=True, text=True, timeout=60)


def plan(*args):
    r = run("plan", "--json", *args)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


class Plan(unittest.TestCase):
    def test_json_contract_on_the_seed_machine(self):
        p = plan("--tasks", "2", "--synthetic", SEED)
        self.assertEqual(p["allowed"], "0-63")
        self.assertEqual(p["warnings"], [])
        self.assertEqual([t["task"] for t in p["tasks"]], [0, 1])
        t0, t1 = p["tasks"]
        self.assertEqual(t0["train_cpus"], "0-7,32-39")
        self.assertEqual(t0["opt_cpus"], "8-15")
        self.assertEqual((t0["train_threads"], t0["opt_threads"]), (8, 8))
        self.assertEqual(t0["opt_mems"], "0")
        self.assertEqual(t1["opt_mems"], "1")
        for key in ("train_cpus", "opt_cpus", "train_threads", "opt_threads", "opt_mems",
                    "nodes", "cores"):
            self.assertIn(key, t1)

    def test_gnu_style_arguments(self):
        joined = plan("--tasks=2", f"--synthetic={SEED}", "--options=train=0.75")
        split = plan("--tasks", "2", "--synthetic", SEED, "--options", "train=0.75")
        self.assertEqual(joined, split)
        self.assertEqual(joined["tasks"][0]["train_threads"], 12)
        for command in ("plan", "show", "tune"):
            r = run(command, "--help")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(f"zenbind {command}"), r.stdout)

    def test_offload_mode(self):
        p = plan("--tasks", "2", "--synthetic", SEED, "--options", "mode=offload")
        t0 = p["tasks"][0]
        self.assertEqual((t0["train_cpus"], t0["opt_cpus"]), ("0-15,32-47", ""))
        self.assertEqual((t0["train_threads"], t0["opt_threads"]), (16, 0))

    def test_sparse_slurm_mask(self):
        p = plan("--tasks", "2", "--synthetic", SEED, "--cpuset", "0,4-11,21-26,30-46")
        self.assertEqual(p["allowed"], "0,4-11,21-26,30-46")
        cores = sorted(t["cores"] for t in p["tasks"])
        self.assertEqual(cores, [11, 12])

    def test_options_reach_the_planner(self):
        p = plan("--tasks", "1", "--synthetic", SEED, "--cpuset", "0-7", "--options", "opt=2")
        self.assertEqual(p["tasks"][0]["opt_cpus"], "6-7")
        p = plan("--tasks", "1", "--synthetic", SEED, "--cpuset", "0-3,32-35", "--options",
                 "smt=opt")
        self.assertEqual(p["tasks"][0]["opt_threads"], 4)

    def test_warnings_are_listed(self):
        p = plan("--tasks", "3", "--synthetic", SEED, "--cpuset", "0-1")
        self.assertTrue(any("3 tasks but only 2 cores" in w for w in p["warnings"]))

    def test_live_machine_uses_the_allowed_cpus(self):
        # Under an affinity of one CPU both commands see exactly that CPU, not the machine's.
        cpu = str(max(os.sched_getaffinity(0)))
        narrowed = lambda *args: subprocess.run(["taskset", "-c", cpu, ZENBIND, *args],
                                                capture_output=True, text=True, timeout=60)
        r = narrowed("plan", "--tasks", "1", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["allowed"], cpu)
        r = narrowed("show", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        shown = json.loads(r.stdout)
        self.assertEqual(shown["allowed"], cpu)
        self.assertTrue(shown["source"], "says where the CPUs came from")
        self.assertEqual(sorted(n["node"] for n in shown["nodes"])[:1], [0])
        self.assertIn(cpu, ",".join(n["allowed"] for n in shown["nodes"]))

    def test_table(self):
        r = run("plan", "--tasks", "8", "--synthetic", SEED)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(any(line.startswith("task") for line in lines))
        self.assertEqual(sum(1 for line in lines if line[:1].isdigit()), 8)


class Tune(unittest.TestCase):
    def test_tune_writes_a_profile_that_plan_reads(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "node.profile")
            r = run("tune", "--output", out, "--elements", "1048576", "--steps", "2", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            result = json.loads(r.stdout)
            self.assertEqual(result["profile"], out)
            self.assertGreaterEqual(len(result["nodes"]), 1)
            for node in result["nodes"]:
                self.assertTrue(1 <= node["saturate"] <= len(node["gb_per_s"]))
                self.assertTrue(all(g > 0 for g in node["gb_per_s"]))
            with open(out) as f:
                self.assertEqual(f.readline(), "zenbind-profile 1\n")
            p = plan("--tasks", "1", "--options", "profile=" + out)
            self.assertEqual(len(p["tasks"]), 1)

    def test_tune_errors(self):
        r = run("tune")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--output FILE is required", r.stderr)
        r = run("tune", "--output", "/nonexistent-dir/x.profile", "--elements", "65536",
                "--steps", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent-dir/x.profile", r.stderr)


class Errors(unittest.TestCase):
    def check(self, args, code, text):
        r = run(*args)
        self.assertEqual(r.returncode, code, r.stderr)
        self.assertTrue(r.stderr.startswith("zenbind: "), r.stderr)
        self.assertIn(text, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_bad_input(self):
        self.check(["plan", "--tasks", "0"], 2, "--tasks")
        self.check(["plan"], 2, "--tasks N is required")
        self.check(["plan", "--tasks", "1", "--bogus"], 2, "unknown argument '--bogus'")
        self.check(["plan", "--tasks", "1", "--cpuset", "4-1"], 2, "descending")
        self.check(["plan", "--tasks", "1", "--synthetic", SEED, "--cpuset", "60-70"], 1,
                   "CPUs 64-70 are not in the topology")
        self.check(["plan", "--tasks", "1", "--options", "trian=1"], 2, "unknown key 'trian'")
        self.check(["plan", "--tasks", "1", "--options", "default=on"], 2, "admin-only")
        self.check(["plan", "--tasks", "1", "--synthetic", "nonsense:3"], 1, "nonsense:3")
        self.check(["plan", "--tasks", "1", "--topology", "/nonexistent.xml"], 1,
                   "/nonexistent.xml")
        self.check(["frobnicate"], 2, "unknown command")

    def test_help_and_version(self):
        self.assertEqual(run("--help").returncode, 0)
        self.assertIn("--tasks", run("help", "plan").stdout)
        self.assertRegex(run("--version").stdout, r"^zenbind \d+\.\d+\.\d+")


if __name__ == "__main__":
    unittest.main()
