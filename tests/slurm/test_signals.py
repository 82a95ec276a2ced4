#!/usr/bin/python3
"""A job told to stop keeps its optimizer state, on real Slurm: scancel (the time limit and
preemption end a job the same way: SIGTERM to every process of its steps, SIGKILL KillWait seconds
later) and scancel --signal=USR1 (sbatch --signal's warning) reach the optimizer worker with the
trainer, whose handler still saves a checkpoint with the Adam moments in it; a job suspended
(scontrol suspend, PreemptMode=SUSPEND) for longer than the optimizer's timeout goes on when
resumed (tests/python/checkpoint_on_signal.py under srun --zenflow-bind). proctrack/cgroup sends
signals but SIGKILL to the tasks alone (slurmstepd's children) and freezes the step to suspend it;
proctrack/linuxproc, as a terminal or a `kill -- -PGID`, signals every process, the worker too
(SIGSTOP to suspend): the affinity run here is where the worker gets them.

    test_signals.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]
"""
import os
import re
import signal
import subprocess
import sys
import time

import slurm_case
from slurm_case import HERE, STEP_TIMEOUT, ClusterCase

SRC = os.path.join(HERE, "..", "..")


class StopSignals(ClusterCase):
    def checkpoint_after(self, *scancel_args, trainer_args=(), before=None):
        """Starts the trainer in an srun step (trainer_args after its checkpoint's path), once it
        trains calls before(job) if given, then scancels the job with scancel_args, and returns
        what it saved (None if nothing) and srun's output."""
        lib, optimizer = os.environ.get("ZB_TEST_BIND_LIB"), os.environ.get("ZB_TEST_OPTIMIZER")
        self.assertTrue(lib and optimizer, "CMake passes ZB_TEST_BIND_LIB and ZB_TEST_OPTIMIZER")
        env = dict(self.env, ZENFLOW_BIND_LIB=lib, ZENFLOW_OPTIMIZER=optimizer,
                   PYTHONPATH=os.path.join(SRC, "python"))
        path = os.path.join(self.dir, "ckpt.pt")
        if os.path.exists(path):
            os.unlink(path)
        script = os.path.join(SRC, "tests", "python", "checkpoint_on_signal.py")
        p = subprocess.Popen(["srun", "-n1", "-c2", "--zenflow-bind", "/usr/bin/python3", script,
                              path, *trainer_args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            job = re.match(r"training job=(\d+)", line)
            if job:
                if before is not None:
                    before(job.group(1))
                self.run_cmd("scancel", *scancel_args, job.group(1))
            out, err = p.communicate(timeout=STEP_TIMEOUT)
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        out = line + out + err
        self.assertTrue(job, out)
        if not os.path.exists(path):
            return None, out
        import torch  # the nodes' python3 has it, as the trainer needs
        return torch.load(path), out

    def assert_moments(self, saved, signal_name, out):
        self.assertIsNotNone(saved, "no checkpoint was saved:\n" + out)
        self.assertEqual(saved["signal"], signal_name, out)
        state = saved["optim"]["state"]
        self.assertEqual(sorted(state), [0, 1, 2, 3], out)
        for entry in state.values():
            self.assertEqual(int(entry["step"]), saved["steps"])
            self.assertGreater(float(entry["exp_avg_sq"].sum()), 0.0)

    def test_scancel_leaves_the_trainer_its_moments_to_save(self):
        saved, out = self.checkpoint_after()
        self.assert_moments(saved, "SIGTERM", out)

    def test_a_usr1_warning_leaves_the_trainer_its_moments_to_save(self):
        saved, out = self.checkpoint_after("--signal=USR1")
        self.assert_moments(saved, "SIGUSR1", out)

    def test_a_job_suspended_past_its_timeout_goes_on_when_resumed(self):
        # scontrol suspend stops (proctrack/linuxproc) or freezes (proctrack/cgroup) every
        # process of the job, the trainer mostly inside its wait for the worker's step (4M
        # parameters, a batch of 4): 3 s suspended, against a timeout_ms of 1 s.
        def suspend(job):
            self.run_cmd("scontrol", "suspend", job)
            time.sleep(3)
            self.run_cmd("scontrol", "resume", job)
            time.sleep(1)

        saved, out = self.checkpoint_after("--signal=USR1", trainer_args=("1000", "2048"),
                                           before=suspend)
        self.assert_moments(saved, "SIGUSR1", out)


if __name__ == "__main__":
    sys.exit(slurm_case.main())
