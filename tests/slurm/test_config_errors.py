#!/usr/bin/python3
"""An administrator's bad plugstack.conf argument fails jobs, never the node: srun, sbatch and
salloc refuse to start with the key named, and a batch job that was already queued when the
argument went bad fails while its node stays up. So does a batch job whose user options cannot be
applied when it starts (denied since it was queued, or put in its environment unchecked). Slurm 25.05 and later do it through
slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE; before 25.05 a failing init in slurmstepd fails
a batch job's launch and slurmctld drains the node ("batch job complete failure"), so there the
plugin loads in slurmstepd and fails each task instead.

    test_config_errors.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]
"""
import glob
import os
import re
import sys
import time

import slurm_case
from slurm_case import STEP_TIMEOUT, ClusterCase

BAD = "default=on,bogus_key=1"


class BrokenPlugstack(ClusterCase):
    def tearDown(self):
        # whatever happened, the next test gets a good plugstack.conf and a node in service
        self.plugstack("")
        if self.drained():
            self.run_cmd("scontrol", "update", f"nodename={self.node()}", "state=resume",
                         check=False)

    def node(self):
        return self.run_cmd("sinfo", "-h", "-N", "-o", "%N").stdout.split()[0]

    def node_state(self):
        return self.run_cmd("scontrol", "show", "node", self.node()).stdout

    def drained(self):
        return re.search(r"State=\S*DRAIN", self.node_state()) is not None

    def job_state(self, job):
        out = self.run_cmd("scontrol", "show", "job", job, check=False).stdout
        m = re.search(r"JobState=(\S+)", out)
        return (m.group(1) if m else "GONE"), out

    def slurmd_log(self):
        text = ""
        for path in glob.glob(os.path.join(self.dir, "log", "slurmd*.log")):
            with open(path, errors="replace") as f:
                text += f.read()
        return text

    def test_srun_sbatch_salloc_refuse_and_name_the_key(self):
        self.plugstack(BAD)
        for cmd in (["srun", "-n1", "true"], ["sbatch", "--wrap", "true"],
                    ["salloc", "-n1", "true"]):
            p = self.run_cmd(*cmd, check=False)
            self.assertNotEqual(p.returncode, 0, f"{cmd[0]} started under a bad plugstack.conf")
            self.assertIn("bogus_key", p.stderr, cmd[0])
        self.assertFalse(self.drained(), self.node_state())

    def failed_batch_job(self, queued_under, starts_under, says, *sbatch_args, env=None):
        """A batch job queued (held) under one plugstack.conf and started under another fails,
        its script does not run, its node stays up, and its output or slurmd's log says why."""
        out = os.path.join(self.dir, "queued.out")
        marker = os.path.join(self.dir, "queued.ran")
        for path in (out, marker):
            if os.path.exists(path):
                os.unlink(path)
        self.plugstack(queued_under)
        p = self.run_cmd("sbatch", "--parsable", "--hold", "-n1", "-o", out, *sbatch_args,
                         "--wrap", f"touch {marker}", env=env)
        job = p.stdout.strip().split(";")[0]
        self.plugstack(starts_under)
        self.run_cmd("scontrol", "release", job)
        deadline = time.time() + STEP_TIMEOUT
        state, show = "PENDING", ""
        while time.time() < deadline:
            state, show = self.job_state(job)
            if self.drained() or state not in ("PENDING", "CONFIGURING", "RUNNING",
                                               "COMPLETING"):
                break
            time.sleep(0.3)
        self.assertFalse(self.drained(), f"the node was drained:\n{self.node_state()}")
        self.assertEqual(state, "FAILED", show)
        self.assertFalse(os.path.exists(marker), "the job's script ran")
        said = self.slurmd_log()
        if os.path.exists(out):
            with open(out, errors="replace") as f:
                said += f.read()
        self.assertIn(says, said, "neither the job's output nor slurmd's log says why")

    def test_queued_batch_job_fails_and_the_node_stays_up(self):
        # Submitted while plugstack.conf is good: sbatch itself would refuse it otherwise.
        self.failed_batch_job("", BAD, "bogus_key")

    def test_user_options_denied_since_queued_fail_the_job_not_the_node(self):
        self.failed_batch_job("train=1", "train=1,override=deny", "override=deny",
                              "--zenflow-bind=train=2")

    def test_user_options_in_the_environment_fail_the_job_not_the_node(self):
        # sbatch does not check what a user puts in the variable that carries the option to
        # the job's steps; slurmstepd hands it to the plugin all the same
        # (a key of its own: slurmd's log holds the other tests' messages too)
        env = dict(self.env, _SLURM_SPANK_OPTION_zenflow_bind_zenflow_bind="no_such_key_in_env")
        self.failed_batch_job("", "", "no_such_key_in_env", env=env)


if __name__ == "__main__":
    sys.exit(slurm_case.main())
