#!/usr/bin/python3
"""Hugging Face transformers' Trainer with zenflow_bind.optim.AdamW under srun --zenflow-bind, as a
user launches it: tests/python/test_hf_trainer.py (train, checkpoint, resume bit-identical) in one
srun step, its worker on the optimizer CPUs the plugin planned. Where the python3 on the nodes has
no transformers (Debian 12 and 13 here) there is nothing to launch and it says so; the Debian
forky root's run has it.

    test_hf_trainer.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]
"""
import os
import re
import subprocess
import sys
import unittest

import slurm_case
from slurm_case import HERE, ClusterCase, cpus

SRC = os.path.join(HERE, "..", "..")


def has_transformers():
    return subprocess.run(["/usr/bin/python3", "-c", "import transformers"],
                          capture_output=True).returncode == 0


@unittest.skipUnless(has_transformers(), "the nodes' python3 has no transformers")
class TrainerOnSlurm(ClusterCase):
    def test_trainer_trains_saves_and_resumes_on_the_planned_cpus(self):
        lib, optimizer = os.environ.get("ZB_TEST_BIND_LIB"), os.environ.get("ZB_TEST_OPTIMIZER")
        self.assertTrue(lib and optimizer, "CMake passes ZB_TEST_BIND_LIB and ZB_TEST_OPTIMIZER")
        env = dict(self.env, ZENFLOW_BIND_LIB=lib, ZENFLOW_OPTIMIZER=optimizer,
                   PYTHONPATH=os.path.join(SRC, "python"))
        script = os.path.join(SRC, "tests", "python", "test_hf_trainer.py")
        p = subprocess.run(["srun", "-n1", "-c2", "--zenflow-bind=verbose", "/usr/bin/python3",
                            script, "-v", "HuggingFaceTrainer.test_trains_saves_and_resumes"],
                           env=env, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertRegex(out, r"Ran 1 test in [0-9.]+s\s+OK\n")  # ran, not skipped
        planned = re.search(r"ZENFLOW_OPT_CPUS=(\S+) worker threads on \[([0-9, ]*)\]", out)
        self.assertIsNotNone(planned, out)
        self.assertEqual({int(c) for c in planned.group(2).split(",")}, cpus(planned.group(1)))


if __name__ == "__main__":
    if not has_transformers():
        # Expected on Debian 12 and 13; say so where scripts/test.sh lists skips (forky runs it).
        print("SKIP: the nodes' python3 has no transformers (the forky root's run has it)",
              file=sys.stderr)
    sys.exit(slurm_case.main())
