"""What every real-Slurm test file shares: the throwaway cluster (cluster.sh) as a TestCase, the
report each task prints, and the command line:

    test_FILE.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]

Needs root and the Slurm daemons. Without them a file exits 77 (ctest's SKIP_RETURN_CODE), except
under any non-empty CI, where a skip is a failure unless ZB_ALLOW_SKIP=1 accepts it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "..", "..", "scripts", "cluster.sh")
SKIP = 77
STEP_TIMEOUT = 60

PLUGIN = ""
TASK_PLUGIN = ""


def cpus(text):
    """Expand a Linux cpu-list ("0-2,5") into a set of ints."""
    out = set()
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def slurm_release():
    """The installed Slurm's (major, minor), from `slurmd -V` ("slurm-wlm 24.11.5")."""
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(\d+)\.(\d+)\.\d+", out)
    if not m:
        raise RuntimeError(f"cannot read Slurm's release from slurmd -V: {out!r}")
    return int(m.group(1)), int(m.group(2))


# Printed by every task: the variables the plugin sets, then the task's real affinity.
REPORT = ("echo \"env=${OMP_NUM_THREADS-unset}|${ZENFLOW_TRAIN_CPUS-unset}|"
          "${ZENFLOW_OPT_CPUS-unset}|${ZENFLOW_OPT_THREADS-unset}|${ZENFLOW_OPT_MEMS-unset}|"
          "${ZENFLOW_BIND_OPTIONS-unset}|$(grep Cpus_allowed_list /proc/self/status | cut -f2)\"")


class Task:
    def __init__(self, line):
        fields = line.split("|")
        self.omp, self.train, self.opt, self.opt_threads, self.mems, self.options = fields[:6]
        self.affinity = cpus(fields[6])


class ClusterCase(unittest.TestCase):
    """A cluster of NODES nodes for the whole class; the plugin loaded without arguments."""
    NODES = 1

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="zb-slurm-")
        cls.env = dict(os.environ, SLURM_CONF=os.path.join(cls.dir, "etc", "slurm.conf"))
        for var in list(cls.env):
            if var.startswith(("SLURM_", "SPANK_", "ZENFLOW_")) and var != "SLURM_CONF":
                del cls.env[var]
        # --lifetime: the daemons stop by themselves even if ctest kills this driver.
        subprocess.run([CLUSTER, "start", cls.dir, "--task-plugin", TASK_PLUGIN, "--nodes",
                        str(cls.NODES), "--lifetime", "600"], check=True, timeout=90)

    @classmethod
    def tearDownClass(cls):
        subprocess.run([CLUSTER, "stop", cls.dir], timeout=60)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def plugstack(self, args=None):
        """Load the plugin with these plugstack.conf arguments, or unload it (None)."""
        cmd = [CLUSTER, "plugstack", self.dir]
        if args is not None:
            cmd += ["--plugin", PLUGIN, "--plugin-args", args]
        subprocess.run(cmd, check=True, timeout=30)

    def setUp(self):
        self.plugstack("")

    def run_cmd(self, *cmd, check=True, env=None):
        p = subprocess.run(list(cmd), env=env or self.env, capture_output=True, text=True,
                           timeout=STEP_TIMEOUT)
        if check and p.returncode != 0:
            self.fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                      f"stderr:\n{p.stderr}")
        return p

    def tasks(self, *srun_args, check=True, env=None):
        """Runs REPORT in every task; returns ({task id: Task}, completed process)."""
        # /bin/bash: under --export=NONE the tasks have no PATH
        p = self.run_cmd("srun", "-l", *srun_args, "/bin/bash", "-c", REPORT, check=check,
                         env=env)
        tasks = {}
        for line in p.stdout.splitlines():
            m = re.match(r"\s*(\d+): env=(.*)", line)
            if m:
                tasks[int(m.group(1))] = Task(m.group(2))
        return tasks, p

    def sbatch_and_wait(self, option, script_body, *sbatch_args, env=None):
        """Submits script_body as a one-task, two-CPU batch job with `option` (from `env`, else
        the cluster's environment), waits for it to end, returns its output."""
        out = os.path.join(self.dir, "batch.out")
        script = os.path.join(self.dir, "job.sh")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n" + script_body)
        p = self.run_cmd("sbatch", "--parsable", "-n1", "-c2", "-o", out, *sbatch_args, option,
                         script, env=env)
        job = p.stdout.strip().split(";")[0]
        deadline = time.time() + STEP_TIMEOUT
        while time.time() < deadline:
            if not self.run_cmd("squeue", "-h", "-j", job, check=False).stdout.strip():
                break
            time.sleep(0.3)
        with open(out) as f:
            return f.read()


def main():
    """Parses the command line, skips (or fails under CI) where Slurm cannot run, then runs the
    calling file's test cases."""
    global PLUGIN, TASK_PLUGIN
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--task-plugin":
        print(__doc__, file=sys.stderr)
        return 2
    PLUGIN, TASK_PLUGIN, rest = os.path.abspath(args[0]), args[2], args[3:]
    missing = [b for b in ("slurmctld", "slurmd", "srun", "sbatch") if not shutil.which(b)]
    why = None
    if os.geteuid() != 0:
        why = "needs root (slurmd creates cgroups and starts tasks)"
    elif missing:
        why = "Slurm is not installed: missing " + ", ".join(missing)
    elif not os.path.exists(PLUGIN):
        why = "plugin not built: " + PLUGIN
    if why:
        # Under any CI a skip would pass silently; ZB_ALLOW_SKIP=1 is the explicit way to accept it.
        if os.environ.get("CI") and os.environ.get("ZB_ALLOW_SKIP") != "1":
            print(f"FAIL: CI={os.environ['CI']} and the Slurm tests cannot run: {why} "
                  "(ZB_ALLOW_SKIP=1 accepts the skip)", file=sys.stderr)
            return 1
        print(f"SKIP: {why}", file=sys.stderr)
        return SKIP
    prog = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1
