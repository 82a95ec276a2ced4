#!/usr/bin/python3
"""What zenflow_bind(8) promises and test_plugin.py does not check, on real Slurm: salloc, an srun
value replacing the job's, ZENFLOW_TASK_CPUS and ZENFLOW_STEP_CPUS, warnings once per node, the
profile read with the user's identity, override=deny at sbatch.

    test_promises.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]
"""
import os
import re
import subprocess
import sys
import tempfile

import slurm_case
from slurm_case import REPORT, STEP_TIMEOUT, ClusterCase, Task, cpus

# The two variables REPORT leaves out, then REPORT's own line.
SHARES = "echo \"shares=${ZENFLOW_TASK_CPUS-unset}|${ZENFLOW_STEP_CPUS-unset}\"; " + REPORT
WARNING = re.compile(r"zenflow-bind: (\S+): warning: (.*)")


def shares(stdout):
    """{task id: (ZENFLOW_TASK_CPUS, ZENFLOW_STEP_CPUS, Task)} from srun -l ... SHARES."""
    found, out = {}, {}
    for line in stdout.splitlines():
        m = re.match(r"\s*(\d+): shares=(.*)\|(.*)", line)
        if m:
            found[int(m.group(1))] = (m.group(2), m.group(3))
        m = re.match(r"\s*(\d+): env=(.*)", line)
        if m:
            out[int(m.group(1))] = Task(m.group(2))
    return {i: (*found[i], out[i]) for i in out if i in found}


class Promises(ClusterCase):
    def srun_shares(self, *args):
        p = self.run_cmd("srun", "-l", *args, "bash", "-c", SHARES)
        return shares(p.stdout), p

    # ---- salloc --------------------------------------------------------------------------------

    def test_salloc_option_binds_the_sruns_inside(self):
        inner = ("echo \"shell=${ZENFLOW_TRAIN_CPUS-unset}\"; "
                 f"srun -l -n1 -c2 bash -c '{REPORT}'")
        p = self.run_cmd("salloc", "-n1", "-c2", "--zenflow-bind=verbose", "bash", "-c", inner)
        self.assertIn("shell=unset", p.stdout, "salloc's own shell is left alone")
        m = re.search(r"0: env=(.*)", p.stdout)
        self.assertTrue(m, p.stdout + p.stderr)
        t = Task(m.group(1))
        self.assertEqual(len(cpus(t.train)), 1, p.stdout)
        self.assertEqual(t.affinity, cpus(t.train))
        self.assertEqual(t.options, "verbose", "salloc's value is the step's")
        self.assertRegex(p.stderr, r"zenflow-bind: \S+ task 0 \(rank 0\): train ")
        # A bad value fails salloc before any allocation.
        p = self.run_cmd("salloc", "-n1", "--zenflow-bind=bogus=1", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unknown key 'bogus'", p.stderr)
        self.assertNotIn("Granted job allocation", p.stderr)

    # ---- an srun value replaces the job's ------------------------------------------------------

    def test_srun_value_replaces_the_sbatch_one(self):
        text = self.sbatch_and_wait(
            "--zenflow-bind=mode=offload",
            f"srun -l -n1 -c2 bash -c '{REPORT}' | sed 's/^0:/inherited:/'\n"
            f"srun -l -n1 -c2 --zenflow-bind=verbose bash -c '{REPORT}' | sed 's/^0:/own:/'\n")
        got = dict(re.findall(r"(inherited|own): env=(.*)", text))
        self.assertEqual(set(got), {"inherited", "own"}, text)
        inherited, own = Task(got["inherited"]), Task(got["own"])
        self.assertEqual(inherited.options, "mode=offload", text)
        self.assertEqual(len(inherited.affinity), 2, "offload: the whole share")
        self.assertEqual(inherited.opt, "unset")
        # Replaced, not merged: the split is back and mode=offload is gone.
        self.assertEqual(own.options, "verbose", text)
        self.assertEqual(len(cpus(own.train)), 1, text)
        self.assertEqual(len(cpus(own.opt)), 1, text)

    # ---- ZENFLOW_TASK_CPUS, ZENFLOW_STEP_CPUS --------------------------------------------------

    def test_task_and_step_cpus(self):
        for args in (["-n2", "-c1"], ["-n1", "-c2"], ["-n1", "-c1"]):
            got, p = self.srun_shares(*args, "--zenflow-bind")
            ntasks = int(args[0][2:])
            self.assertEqual(sorted(got), list(range(ntasks)), p.stdout + p.stderr)
            union = set()
            for i, (task_cpus, step_cpus, t) in got.items():
                # the task's whole share: its training and optimizer CPUs
                self.assertEqual(cpus(task_cpus), cpus(t.train) | cpus(t.opt), (args, i))
                union |= cpus(task_cpus)
            # the step's CPUs on the node, the same for every task: what the shares divide
            self.assertEqual({frozenset(cpus(s)) for _, s, _ in got.values()},
                             {frozenset(union)}, (args, got))
            self.assertEqual(len(union), ntasks * int(args[1][2:]), args)

    # ---- warnings once per node ----------------------------------------------------------------

    def test_warnings_once_per_node(self):
        _, p = self.srun_shares("-n2", "-c1", "--zenflow-bind")
        warnings = WARNING.findall(p.stderr)
        self.assertEqual(len(warnings), 1, p.stderr)
        self.assertIn("tasks 0-1: a single core", warnings[0][1])

    # ---- the profile is read with the user's identity ------------------------------------------

    def test_profile_is_read_with_the_users_identity(self):
        user = f"zbt{os.getpid() % 100000}"
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", user], check=True, timeout=30)
        self.addCleanup(subprocess.run, ["userdel", user], timeout=30)
        # The user must read the cluster's configuration: this cluster's files only.
        for d, _, files in os.walk(os.path.join(self.dir, "etc")):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        os.chmod(self.dir, 0o755)
        profiles = tempfile.mkdtemp(prefix="zb-profiles-")
        self.addCleanup(subprocess.run, ["rm", "-rf", profiles])
        os.chmod(profiles, 0o755)
        profile = os.path.join(profiles, "node.profile")
        with open(profile, "w") as f:
            f.write("zenbind-profile 1\nnode 0 saturate 2 gbps 10.000,20.000\n")
        self.plugstack("onerror=fail")
        as_user = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.env['SLURM_CONF']}",
                   "srun", "-l", "-n1", "-c2", f"--zenflow-bind=profile={profile}", "bash", "-c",
                   REPORT]

        def run_as_user():
            return subprocess.run(as_user, capture_output=True, text=True, timeout=STEP_TIMEOUT,
                                  cwd="/tmp", env=self.env)

        os.chmod(profile, 0o600)  # root's alone: the user's step must not read it
        p = run_as_user()
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("0: env=", p.stdout, "onerror=fail: the task must not run")
        self.assertIn(f"cannot load profile={profile}: cannot open {profile}: Permission denied",
                      p.stderr)
        os.chmod(profile, 0o644)
        p = run_as_user()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        m = re.search(r"0: env=(.*)", p.stdout)
        self.assertTrue(m, p.stdout)
        self.assertIn("opt=2", Task(m.group(1)).options, "the profile was read")

    # ---- override=deny at sbatch ---------------------------------------------------------------

    def test_override_deny_refuses_at_sbatch(self):
        self.plugstack("default=on,override=deny mode=offload")
        marker = os.path.join(self.dir, "ran")
        for value, why in (("mode=split", "'mode' is fixed by the administrator"),
                           ("off", "'off' is refused")):
            p = self.run_cmd("sbatch", f"--zenflow-bind={value}", "--wrap", f"touch {marker}",
                             check=False)
            self.assertNotEqual(p.returncode, 0, value)
            self.assertIn(why, p.stderr, value)
            self.assertNotIn("Submitted batch job", p.stdout, value)
        p = self.run_cmd("sbatch", "-o", "/dev/null", "--zenflow-bind=mode=offload", "--wrap",
                         "true")
        self.assertIn("Submitted batch job", p.stdout, "restating the site's value is fine")


class TwoNodePromises(ClusterCase):
    NODES = 2

    def test_warnings_once_per_node(self):
        p = self.run_cmd("srun", "-N2", "-n4", "-c1", "--zenflow-bind", "true")
        nodes = [node for node, text in WARNING.findall(p.stderr)
                 if "tasks 0-1: a single core" in text]
        self.assertEqual(len(nodes), 2, p.stderr)
        self.assertEqual(len(set(nodes)), 2, "one from each node")


if __name__ == "__main__":
    sys.exit(slurm_case.main())
