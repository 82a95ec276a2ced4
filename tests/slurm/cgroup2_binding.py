#!/usr/bin/python3
"""srun --zenflow-bind under Slurm's cgroup/v2 (TaskPlugin=task/cgroup,task/affinity): each task
bound inside its step's v2 cpuset, with ConstrainCores=yes and without it (ZB_CONSTRAIN_CORES=no).
Runs on a unified cgroup v2 hierarchy only: debian_root.sh's VM. Not a test_*.py: the hosts that run
tests/slurm mount cgroup v1, where it has nothing to test.

    cgroup2_binding.py PLUGIN_SO --task-plugin cgroup [unittest args]
"""
import os
import re
import sys

import slurm_case
from slurm_case import ClusterCase, cpus

CGROUP2 = "/sys/fs/cgroup"
# The name of the job's level that this run's Slurm and CgroupJobIdPaths give: job_<id>, or a SLUID
# (an "s" and base-32 digits, e.g. sDB9M88G5WN700) where 26.05 is left to its default.
JOB_DIR = (r"^s[0-9A-Z]+$" if os.environ.get("ZB_CGROUP_JOB_ID_PATHS") == "no"
           else r"^job_\d+$")

# Each task: its own cgroup (the "0::" line), its affinity, the plugin's variables, and its step's
# cpuset files, read while the step exists (Slurm removes its cgroups as soon as it ends). Slurm's
# cgroup/v2 writes a step's limits into step_N/user, the parent of the task_N cgroups
# (src/plugins/cgroup/v2: CG_LEVEL_STEP is CG_LEVEL_STEP_USER). The job's level above the step is
# job_<id> up to Slurm 24.11; 26.05 names it by the job's SLUID unless CgroupJobIdPaths=yes
# (ZB_CGROUP_JOB_ID_PATHS, which cluster.sh writes into cgroup.conf).
REPORT = ("cg=$(sed -n 's/^0:://p' /proc/self/cgroup); "
          f"step={CGROUP2}$(echo \"$cg\" | grep -o '^.*/step_[0-9]*'); "
          "echo \"v2=$cg|$(grep Cpus_allowed_list /proc/self/status | cut -f2)|"
          "${ZENFLOW_TRAIN_CPUS-unset}|${ZENFLOW_OPT_CPUS-unset}|"
          "$(cat $step/cpuset.cpus.effective)|$(cat $step/user/cpuset.cpus)\"")


def read(path):
    with open(path) as f:
        return f.read().strip()


class TaskCgroup:
    def __init__(self, line):
        self.path, affinity, self.train, self.opt, effective, self.configured = line.split("|")
        self.affinity = cpus(affinity)
        step = re.search(r"/([^/]+)/step_\d+(/|$)", self.path)
        self.in_step = step is not None
        self.job_dir = step.group(1) if step else None
        self.step_set = cpus(effective)


class CgroupV2Binding(ClusterCase):
    def constrained(self):
        return os.environ.get("ZB_CONSTRAIN_CORES", "yes") == "yes"

    def run_tasks(self, *args):
        p = self.run_cmd("srun", "-l", *args, "--zenflow-bind=verbose", "bash", "-c", REPORT)
        tasks = {}
        for line in p.stdout.splitlines():
            m = re.match(r"\s*(\d+): v2=(.*)", line)
            if m:
                tasks[int(m.group(1))] = TaskCgroup(m.group(2))
        return tasks, p

    def test_cluster_runs_cgroup_v2(self):
        self.assertTrue(os.path.exists(os.path.join(CGROUP2, "cgroup.controllers")),
                        "/sys/fs/cgroup is not a cgroup v2 mount")
        conf = read(os.path.join(self.dir, "etc", "cgroup.conf"))
        self.assertIn("CgroupPlugin=cgroup/v2", conf)
        self.assertIn(f"ConstrainCores={'yes' if self.constrained() else 'no'}", conf)

    def test_each_task_is_bound_inside_its_step_cpuset(self):
        tasks, p = self.run_tasks("-n2", "-c2")
        self.assertEqual(sorted(tasks), [0, 1], p.stdout + p.stderr)
        used = set()
        for i, t in tasks.items():
            self.assertTrue(t.in_step, f"task {i} is not in a step cgroup: {t.path}")
            self.assertRegex(t.job_dir, JOB_DIR, f"task {i}: the job's cgroup, {t.path}")
            train, opt = cpus(t.train), cpus(t.opt)
            self.assertEqual((len(train), len(opt)), (1, 1), f"task {i}")
            self.assertEqual(t.affinity, train, f"task {i} runs on its training CPU")
            self.assertLessEqual(train | opt, t.step_set, f"task {i} inside its step: {t.path}")
            self.assertFalse(used & (train | opt), "tasks share no CPU")
            used |= train | opt
            if self.constrained():
                # Slurm confines the step to its cores: the plugin splits exactly those.
                self.assertTrue(t.configured, "ConstrainCores=yes configures the step's cpuset")
                self.assertLessEqual(train | opt, cpus(t.configured))
            else:
                self.assertEqual(t.configured, "", "ConstrainCores=no leaves the step's unset")
        # Where the plugin took the step's CPUs from: the step's v2 cgroup when Slurm confines
        # it, else Slurm's allocation.
        lines = [l for l in p.stderr.splitlines() if re.search(r"zenflow-bind: \S+ task \d", l)]
        self.assertEqual(len(lines), 2, p.stderr)
        for l in lines:
            if self.constrained():
                # whatever names the job's level: the plugin finds the step from the task's cgroup
                self.assertRegex(
                    l, r"from /sys/fs/cgroup/\S+/step_\d+/user/cpuset\.cpus\.effective$")
            else:
                self.assertTrue(l.endswith("from S_STEP_ALLOC_CORES"), l)

    def test_one_task_whole_step(self):
        tasks, p = self.run_tasks("-n1", "-c4")
        t = tasks[0]
        self.assertEqual(len(cpus(t.train) | cpus(t.opt)), 4, p.stderr)
        self.assertLessEqual(cpus(t.train) | cpus(t.opt), t.step_set)
        self.assertEqual(t.affinity, cpus(t.train))

if __name__ == "__main__":
    sys.exit(slurm_case.main())
