#!/usr/bin/python3
"""zenflow_bind.so on a real Slurm: real srun/sbatch steps on a throwaway cluster.

    test_plugin.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]
"""
import math
import os
import re
import shutil
import socket
import subprocess
import sys

import slurm_case
from slurm_case import CLUSTER, HERE, REPORT, STEP_TIMEOUT, ClusterCase, Task, cpus


class WorkloadOnSlurm(ClusterCase):
    """The Python example in contrib/examples: a torch model whose AdamW step runs in the optimizer worker,
    launched the way users launch it, with srun --zenflow-bind."""

    def test_python_model_trains_through_the_worker_on_its_own_cores(self):
        lib, optimizer = os.environ.get("ZB_TEST_BIND_LIB"), os.environ.get("ZB_TEST_OPTIMIZER")
        self.assertTrue(lib and optimizer, "CMake passes ZB_TEST_BIND_LIB and ZB_TEST_OPTIMIZER")
        env = dict(self.env, ZENFLOW_BIND_LIB=lib, ZENFLOW_OPTIMIZER=optimizer,
                   PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
        example = os.path.join(HERE, "..", "..", "contrib", "examples", "python",
                               "train_overlap.py")
        p = subprocess.run(["srun", "-n1", "-c2", "--zenflow-bind=verbose", "/usr/bin/python3",
                            example, "--steps", "200"], env=env, capture_output=True, text=True,
                           timeout=240)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        losses = [float(m) for m in re.findall(r"step +\d+ +loss ([0-9.e+-]+)", p.stdout)]
        self.assertGreaterEqual(len(losses), 2, p.stdout)
        self.assertLess(losses[-1], losses[0] / 2, "the loss falls")
        planned = re.search(r"optimizer (\S+) \(", p.stderr)
        self.assertIsNotNone(planned, p.stderr)
        worker_cpus = {int(c) for c in re.findall(r"\(\d+, (\d+)\)", p.stdout)}
        self.assertEqual(worker_cpus, cpus(planned.group(1)),
                         "the worker's threads run on the optimizer CPUs the plugin planned")


    def test_data_parallel_ranks_step_their_averages_on_their_own_cores(self):
        # contrib/examples/python/train_ddp.py: one srun task per DDP rank (gloo), each rank's
        # worker on its planned optimizer CPUs, DDP's averages taken by register_ddp() and
        # stepped during backward; the ranks end equal, and equal to torch's AdamW's run
        lib, optimizer = os.environ.get("ZB_TEST_BIND_LIB"), os.environ.get("ZB_TEST_OPTIMIZER")
        self.assertTrue(lib and optimizer, "CMake passes ZB_TEST_BIND_LIB and ZB_TEST_OPTIMIZER")
        example = os.path.join(HERE, "..", "..", "contrib", "examples", "python", "train_ddp.py")
        sums = {}
        for name in ("zenflow", "torch"):
            env = dict(self.env, ZENFLOW_BIND_LIB=lib, ZENFLOW_OPTIMIZER=optimizer,
                       PYTHONPATH=os.path.join(HERE, "..", "..", "python"),
                       MASTER_PORT=str(free_port()))
            p = subprocess.run(["srun", "-n2", "-c1", "--zenflow-bind=verbose",
                                "/usr/bin/python3", example, "--steps", "20", "--optimizer",
                                name], env=env, capture_output=True, text=True, timeout=240)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            ranks = dict(re.findall(r"rank (\d+): parameters sum (\S+)", p.stdout))
            self.assertEqual(set(ranks), {"0", "1"}, out)
            self.assertEqual(ranks["0"], ranks["1"], "DDP keeps the ranks equal")
            sums[name] = float(ranks["0"])
            if name == "zenflow":
                workers = re.findall(r"rank (\d+): ZENFLOW_OPT_CPUS=(\S+) worker threads on "
                                     r"\[([0-9, ]*)\]", p.stdout)
                self.assertEqual(len(workers), 2, out)
                for _, planned, threads in workers:
                    self.assertEqual({int(c) for c in threads.split(",")}, cpus(planned))
        self.assertTrue(math.isclose(sums["zenflow"], sums["torch"], rel_tol=1e-5), sums)


def free_port():
    """A TCP port free on this host now, for the ranks to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PluginOnSlurm(ClusterCase):
    # ---- the option itself ----------------------------------------------------------------

    def test_help_lists_option(self):
        p = self.run_cmd("srun", "--help")
        self.assertIn("--zenflow-bind", p.stdout + p.stderr)

    def test_one_task_two_cores_splits_one_one(self):
        tasks, _ = self.tasks("-n1", "-c2", "--zenflow-bind")
        t = tasks[0]
        train, opt = cpus(t.train), cpus(t.opt)
        self.assertEqual(len(train), 1)
        self.assertEqual(len(opt), 1)
        self.assertFalse(train & opt, "training and optimizer CPUs must differ")
        self.assertEqual(t.affinity, train, "the task runs on its training CPUs")
        self.assertEqual((t.omp, t.opt_threads), ("1", "1"))
        self.assertEqual(t.mems, "0")

    def test_two_tasks_one_core_each_share_with_optimizer(self):
        tasks, p = self.tasks("-n2", "-c1", "--zenflow-bind")
        self.assertEqual(sorted(tasks), [0, 1])
        a, b = tasks[0], tasks[1]
        for t in (a, b):
            self.assertEqual(len(t.affinity), 1)
            self.assertEqual(cpus(t.train), t.affinity)
            self.assertEqual(cpus(t.opt), t.affinity, "one core: the optimizer shares it")
        self.assertNotEqual(a.affinity, b.affinity, "each task gets its own core")
        self.assertRegex(p.stderr, r"zenflow-bind: .*warning")

    def test_verbose_prints_one_line_per_task(self):
        _, p = self.tasks("-n2", "-c1", "--zenflow-bind=verbose")
        lines = [l for l in p.stderr.splitlines() if re.search(r"zenflow-bind: \S+ task \d", l)]
        self.assertEqual(len(lines), 2, p.stderr)
        for i in (0, 1):
            self.assertTrue(any(f" task {i} " in l and "train" in l and "optimizer" in l
                                and "NUMA" in l for l in lines), p.stderr)
        # Where the step's CPUs came from: its cpuset cgroup under task/cgroup, else Slurm's
        # allocation (task/affinity alone leaves tasks in the root cpuset).
        for l in lines:
            if slurm_case.TASK_PLUGIN == "cgroup":
                self.assertRegex(l, r"from /\S+/job_\d+/step_\d+/cpuset\.effective_cpus$")
            else:
                self.assertTrue(l.endswith("from S_STEP_ALLOC_CORES"), l)

    def test_without_option_slurm_binding_is_unchanged(self):
        for args in (["-n2", "-c1"], ["-n1", "-c2"]):
            self.plugstack(None)
            without, _ = self.tasks(*args)
            self.plugstack("")
            loaded, _ = self.tasks(*args)
            self.assertEqual(sorted(without), sorted(loaded))
            for i, t in loaded.items():
                self.assertEqual(t.affinity, without[i].affinity, args)
                self.assertEqual((t.omp, t.train, t.opt), ("unset",) * 3)
            off, _ = self.tasks(*args, "--zenflow-bind=off")
            for i, t in off.items():
                self.assertEqual(t.affinity, without[i].affinity, args)
                self.assertEqual(t.train, "unset")

    def test_bad_option_fails_before_any_task(self):
        marker = os.path.join(self.dir, "ran")
        for value, key in (("bogus=1", "bogus"), ("train=abc", "train"), ("opt=-1", "opt"),
                           ("default=on", "default")):
            p = self.run_cmd("srun", "-n1", f"--zenflow-bind={value}", "touch", marker,
                             check=False)
            self.assertNotEqual(p.returncode, 0, value)
            self.assertIn(key, p.stderr, value)
            self.assertFalse(os.path.exists(marker), f"{value}: a task ran")
        p = self.run_cmd("sbatch", "--zenflow-bind=bogus=1", "--wrap", f"touch {marker}",
                         check=False)
        self.assertNotEqual(p.returncode, 0, "sbatch must refuse it at submission")
        self.assertIn("bogus", p.stderr)

    def test_hostile_option_is_refused(self):
        # Valid items all the way: only the length bound can refuse it.
        value = ",".join(["train=1"] * 1200)
        self.assertGreater(len(value), 8192)
        p = self.run_cmd("srun", "-n1", "--zenflow-bind=" + value, "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("longer than 8192 bytes", p.stderr)

    def test_offload_mode_binds_the_whole_share(self):
        tasks, p = self.tasks("-n1", "-c2", "--zenflow-bind=mode=offload,verbose")
        t = tasks[0]
        self.assertEqual(len(t.affinity), 2, "the task runs on its whole share")
        self.assertEqual(cpus(t.train), t.affinity)
        self.assertEqual(t.omp, "2", "one OpenMP thread per core of the share")
        self.assertEqual((t.opt, t.opt_threads, t.mems), ("unset",) * 3,
                         "no optimizer worker: no ZENFLOW_OPT_* variable")
        self.assertIn("mode=offload", t.options)
        self.assertRegex(p.stderr, r"zenflow-bind: \S+ task 0 \(rank 0\): offload ")

    # ---- srun --cpu-bind ---------------------------------------------------------------------

    def test_cpu_bind_choosing_cpus_is_refused_before_any_task(self):
        marker = os.path.join(self.dir, "ran")
        # Slurm 24.11 and later ignore --cpu-bind=rank ("Rank binding is obsolete"): nothing to refuse.
        rank = ("rank",) if slurm_case.slurm_release() < (24, 11) else ()
        for bind in ("map_cpu:1", "none") + rank:
            p = self.run_cmd("srun", "-n1", "-c2", f"--cpu-bind={bind}", "--zenflow-bind",
                             "touch", marker, check=False)
            self.assertNotEqual(p.returncode, 0, bind)
            self.assertIn(f"--cpu-bind={bind}", p.stderr)
            self.assertIn("give only one of them", p.stderr)
            self.assertFalse(os.path.exists(marker), f"--cpu-bind={bind}: a task ran")

    def test_a_refused_step_inside_an_allocation_frees_its_cpus(self):
        # Refused in srun once srun had made the step, the step kept the job's CPUs until the
        # allocation ended: the script's next srun waited for them.
        text = self.sbatch_and_wait(
            "--export=ALL",
            f"srun -n1 -c2 --cpu-bind=map_cpu:1 --zenflow-bind touch {self.dir}/ran\n"
            "echo refused=$?\n"
            "timeout 20 srun -n1 -c2 true; echo next=$?\n")
        self.assertRegex(text, r"refused=[1-9]")
        self.assertIn("give only one of them", text)
        self.assertIn("next=0", text)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "ran")))

    def test_srun_inside_a_task_says_where_its_cpu_bind_comes_from(self):
        # A task's SLURM_CPU_BIND holds its mask; a nested srun takes it as --cpu-bind
        inner = "srun -n1 -c1 --overlap {} --zenflow-bind /bin/bash -c 'echo in=$ZENFLOW_TRAIN_CPUS'"
        p = self.run_cmd("srun", "-n1", "-c2", "/bin/bash", "-c",
                         inner.format("") + "; echo rc=$?; unset SLURM_CPU_BIND; " +
                         inner.format("") + "; " + inner.format("--cpu-bind=cores"), check=False)
        self.assertIn("--cpu-bind=mask_cpu", p.stderr)
        self.assertIn("an exported SLURM_CPU_BIND counts as --cpu-bind", p.stderr)
        self.assertRegex(p.stdout, r"rc=[1-9]")
        self.assertEqual(len(re.findall(r"in=\d", p.stdout)), 2, (p.stdout, p.stderr))

    def test_cpu_bind_granularity_is_refined_and_said(self):
        tasks, p = self.tasks("-n1", "-c2", "--cpu-bind=cores", "--zenflow-bind")
        t = tasks[0]
        self.assertEqual(len(cpus(t.train)), 1)
        self.assertEqual(t.affinity, cpus(t.train), "zenflow-bind's binding, not Slurm's")
        self.assertIn("--cpu-bind=cores (from --cpu-bind, or a --hint Slurm turned into it): "
                      "each task is bound by zenflow-bind", p.stderr)

    def test_cpu_bind_verbose_is_told_the_mask_was_replaced(self):
        tasks, p = self.tasks("-n1", "-c2", "--cpu-bind=verbose", "--zenflow-bind")
        line = [l for l in p.stderr.splitlines() if "replaces the --cpu-bind mask above" in l]
        self.assertEqual(len(line), 1, p.stderr)
        self.assertIn(f"train {tasks[0].train} ", line[0])

    def test_cpu_bind_wins_over_the_sites_default(self):
        self.plugstack(None)
        slurm_only, _ = self.tasks("-n1", "-c2", "--cpu-bind=map_cpu:1")
        self.plugstack("default=on")
        # Variables inherited from a bound batch step must not reach a step left to Slurm.
        inherited = dict(self.env, ZENFLOW_TRAIN_CPUS="0", ZENFLOW_OPT_CPUS="1",
                         ZENFLOW_BIND_OPTIONS="batch")
        tasks, p = self.tasks("-n1", "-c2", "--cpu-bind=map_cpu:1", env=inherited)
        t = tasks[0]
        self.assertEqual(t.affinity, slurm_only[0].affinity, "Slurm's binding is kept")
        self.assertEqual((t.omp, t.train, t.opt), ("unset",) * 3)
        self.assertIn("keeps Slurm's binding", p.stderr)
        plain, _ = self.tasks("-n1", "-c2")  # and default=on still binds without --cpu-bind
        self.assertNotEqual(plain[0].train, "unset")
        # srun passes the decision on under --export=NONE (or a list) too, which hands the
        # tasks srun's SLURM_* variables and no others
        tasks, p = self.tasks("-n1", "-c2", "--cpu-bind=map_cpu:1", "--export=NONE")
        self.assertEqual(tasks[0].affinity, slurm_only[0].affinity, "Slurm's binding is kept")
        self.assertEqual((tasks[0].omp, tasks[0].train), ("unset",) * 2)
        self.assertIn("keeps Slurm's binding", p.stderr)

    def test_steps_it_leaves_alone_keep_no_inherited_plan(self):
        # Inside a bound batch step, every step the script starts inherits the batch step's
        # plan; a step that is not bound must not pass it to its tasks' optimizer workers.
        inherited = dict(self.env, ZENFLOW_TRAIN_CPUS="0", ZENFLOW_OPT_CPUS="1",
                         ZENFLOW_OPT_THREADS="1", ZENFLOW_BIND_OPTIONS="batch")
        for args in (("--zenflow-bind=off",), ()):
            tasks, _ = self.tasks("-n1", "-c2", *args, env=inherited)
            t = tasks[0]
            self.assertEqual((t.train, t.opt, t.opt_threads, t.options), ("unset",) * 4, args)
        # OMP_NUM_THREADS goes back to the user's value kept beside the plan (empty: none),
        # while it holds the plan's; one set since, or a plan without the user's kept, stays
        for kept, omp, want in (("7", "1", "7"), ("", "1", "unset"), ("7", "2", "2"),
                                (None, "4", "4")):
            env = dict(inherited, OMP_NUM_THREADS=omp, ZENFLOW_TRAIN_THREADS="1")
            if kept is not None:
                env["ZENFLOW_USER_OMP_NUM_THREADS"] = kept
            tasks, _ = self.tasks("-n1", "-c2", "--zenflow-bind=off", env=env)
            self.assertEqual(tasks[0].omp, want, (kept, omp))
        # without ZENFLOW_BIND_OPTIONS they are no plan of the plugin's: a user's own, kept
        own = dict(self.env, ZENFLOW_OPT_CPUS="1", ZENFLOW_OPT_THREADS="1")
        tasks, _ = self.tasks("-n1", "-c2", env=own)
        self.assertEqual((tasks[0].opt, tasks[0].opt_threads), ("1", "1"))

    def test_sbatch_option_reaches_srun_in_script(self):
        # The bare form matters: 22.05 hands it to the job's srun as the text "(null)".
        for option in ("--zenflow-bind", "--zenflow-bind=verbose"):
            text = self.sbatch_and_wait(option, "echo \"batch=${ZENFLOW_TRAIN_CPUS-unset}\"\n"
                                        f"srun -l -n1 -c2 bash -c '{REPORT}'\n")
            self.assertIn("batch=unset", text, "the batch step is left alone")
            m = re.search(r"0: env=(.*)", text)
            self.assertTrue(m, text)
            t = Task(m.group(1))
            self.assertEqual(len(cpus(t.train)), 1, text)
            self.assertEqual(t.affinity, cpus(t.train), text)
            if option.endswith("verbose"):
                self.assertIn("verbose", t.options)
                self.assertRegex(text, r"zenflow-bind: \S+ task 0 ")

    def test_batch_key_binds_the_script(self):
        # The script's steps that are not bound get the user's OMP_NUM_THREADS back, not the
        # batch step's; a bound one keeps it for the steps it starts.
        # One the script sets itself is the user's from then on.
        off = "srun -n1 -c2 --zenflow-bind=off bash -c 'echo {}=${{OMP_NUM_THREADS-unset}}'\n"
        script = ("echo \"batch=${ZENFLOW_TRAIN_CPUS-unset} omp=${OMP_NUM_THREADS-unset}\"\n" +
                  off.format("off") +
                  "srun -n1 -c2 bash -c 'echo on=${OMP_NUM_THREADS-unset} "
                  "user=${ZENFLOW_USER_OMP_NUM_THREADS-unset}'\n"
                  "export OMP_NUM_THREADS=2\n" + off.format("exported") +
                  "srun -n1 -c2 bash -c 'echo on_exported=${OMP_NUM_THREADS-unset} "
                  "user=${ZENFLOW_USER_OMP_NUM_THREADS-unset}'\n"
                  "unset OMP_NUM_THREADS\n" + off.format("unset"))
        for user in ("7", None):
            env = dict(self.env)
            if user:
                env["OMP_NUM_THREADS"] = user
            text = self.sbatch_and_wait("--zenflow-bind=batch", script, env=env)
            m = re.search(r"batch=(\S+) omp=1\n", text)
            self.assertTrue(m, text)
            self.assertEqual(len(cpus(m.group(1))), 1, text)
            self.assertIn(f"off={user or 'unset'}\n", text)
            self.assertIn(f"on=1 user={user or ''}\n", text)
            self.assertIn("exported=2\n", text)
            self.assertIn("on_exported=1 user=2\n", text)
            self.assertIn("unset=unset\n", text)

    # ---- plugstack.conf --------------------------------------------------------------------

    def test_admin_default_on_binds_without_option(self):
        # The site's value must show: mode=offload binds unlike the default split.
        self.plugstack("default=on mode=offload")
        tasks, _ = self.tasks("-n1", "-c2")
        t = tasks[0]
        self.assertEqual(len(t.affinity), 2, "offload: the whole share")
        self.assertEqual(t.affinity, cpus(t.train))
        self.assertEqual((t.omp, t.opt), ("2", "unset"))
        self.assertIn("mode=offload", t.options)
        off, _ = self.tasks("-n1", "-c2", "--zenflow-bind=off")
        self.assertEqual(off[0].train, "unset", "users may turn it off under override=allow")

    def test_override_deny_refuses_user_change(self):
        self.plugstack("default=on,override=deny mode=offload")
        p = self.run_cmd("srun", "-n1", "-c2", "--zenflow-bind=mode=split", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("'mode' is fixed by the administrator (override=deny", p.stderr)
        p = self.run_cmd("srun", "-n1", "-c2", "--zenflow-bind=off", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("'off' is refused", p.stderr)
        tasks, _ = self.tasks("-n1", "-c2", "--zenflow-bind=mode=offload,verbose")
        t = tasks[0]
        self.assertEqual((len(t.affinity), t.opt), (2, "unset"),
                         "restating the admin's value is fine, and it applies")
        self.assertIn("verbose", t.options, "keys the admin did not set stay open")
        tasks, _ = self.tasks("-n1", "-c2", "--zenflow-bind=verbose")
        self.assertEqual((len(tasks[0].affinity), tasks[0].opt), (2, "unset"),
                         "the user's value goes on top of the site's, which stays")

    def test_unknown_plugstack_key_refuses_to_load(self):
        self.plugstack("frobnicate=1")
        p = self.run_cmd("srun", "-n1", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("frobnicate", p.stderr)

    # ---- what loading the plugin costs ------------------------------------------------------

    def test_only_binding_steps_load_libzenbind(self):
        # The step's slurmstepd is the task's parent: what it has mapped is what Slurm loaded.
        show = "grep -oE '(libzenbind|zenflow_bind_binder|libhwloc)[^ ]*' /proc/$PPID/maps | sort -u"
        plain = self.run_cmd("srun", "-n1", "bash", "-c", show).stdout
        self.assertNotIn("libzenbind", plain, "a job without --zenflow-bind loads no libzenbind")
        self.assertNotIn("zenflow_bind_binder", plain)
        bound = self.run_cmd("srun", "-n1", "-c2", "--zenflow-bind", "bash", "-c", show).stdout
        self.assertIn("zenflow_bind_binder.so", bound)
        self.assertIn("libzenbind", bound)

    def test_missing_binder_follows_onerror(self):
        installed = os.path.join(os.environ.get("ZB_TEST_BINDER_DIR", "/nonexistent"),
                                 "zenflow_bind_binder.so")
        if os.path.exists(installed):
            self.skipTest(f"an installed binder ({installed}) would be found")
        alone = os.path.join(self.dir, "alone")
        os.makedirs(alone, exist_ok=True)
        shutil.copy(slurm_case.PLUGIN, alone)
        with open(os.path.join(alone, "zenflow_bind_binder.so"), "w") as f:
            f.write("not an ELF object\n")
        plugin = os.path.join(alone, os.path.basename(slurm_case.PLUGIN))
        subprocess.run([CLUSTER, "plugstack", self.dir, "--plugin", plugin, "--plugin-args",
                        "onerror=warn"], check=True, timeout=30)
        tasks, p = self.tasks("-n1", "-c2", "--zenflow-bind")
        self.assertEqual(tasks[0].train, "unset", "the task runs as Slurm bound it")
        self.assertIn("cannot load zenflow_bind_binder.so", p.stderr)
        subprocess.run([CLUSTER, "plugstack", self.dir, "--plugin", plugin, "--plugin-args",
                        "onerror=fail"], check=True, timeout=30)
        tasks, p = self.tasks("-n1", "-c2", "--zenflow-bind", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn(0, tasks, "onerror=fail: the task must not run")
        self.assertIn("cannot load zenflow_bind_binder.so", p.stderr)

    def test_onerror_fail_and_warn(self):
        # Two training plus two optimizer cores cannot fit in two.
        self.plugstack("onerror=fail")
        tasks, p = self.tasks("-n1", "-c2", "--zenflow-bind=train=2,opt=2", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn(0, tasks, "onerror=fail: the task must not run")
        # The plugin's own line, not merely srun's "error:" about the failed task.
        self.assertRegex(p.stderr, r"zenflow-bind: \S+: error: no plan for 1 task\(s\) on "
                                   r"CPUs \S+: task 0 has 2 cores, fewer than the 2 training \+ 2 "
                                   r"optimizer cores asked for")
        self.plugstack(None)
        plain, _ = self.tasks("-n1", "-c2")
        self.plugstack("onerror=warn")
        # Variables inherited from a bound batch step must not survive into a task left unbound
        # (the worker would pin itself to them); the user's OMP_NUM_THREADS stays.
        inherited = dict(self.env, ZENFLOW_TRAIN_CPUS="0", ZENFLOW_OPT_CPUS="1",
                         ZENFLOW_OPT_MEMS="0", OMP_NUM_THREADS="7")
        tasks, p = self.tasks("-n1", "-c2", "--zenflow-bind=train=2,opt=2", env=inherited)
        self.assertEqual(tasks[0].affinity, plain[0].affinity, "left as Slurm bound it")
        self.assertEqual((tasks[0].train, tasks[0].opt, tasks[0].mems), ("unset",) * 3)
        self.assertEqual(tasks[0].omp, "7")
        self.assertIn("warning", p.stderr)

    def test_profile_sets_optimizer_cores_and_a_missing_one_is_reported(self):
        profile = os.path.join(self.dir, "node.profile")
        with open(profile, "w") as f:
            # Saturates at 2 cores: more than the default split's 1, so the profile must show.
            f.write("zenbind-profile 1\nnode 0 saturate 2 gbps 10.000,20.000\n")
        tasks, p = self.tasks("-n1", "-c2", f"--zenflow-bind=profile={profile}")
        self.assertIn("opt=2", tasks[0].options, "the profile chose the optimizer cores")
        # A 2-core share cannot give both to the optimizer: the plan keeps one and says so.
        self.assertIn("leaves no training core out of 2", p.stderr)
        self.assertEqual(len(cpus(tasks[0].opt)), 1)
        self.plugstack("onerror=fail")
        missing = os.path.join(self.dir, "missing.profile")
        tasks, p = self.tasks("-n2", "-c1", f"--zenflow-bind=profile={missing}", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(tasks, {})
        # The same for every task of the node: said once, not once per task.
        self.assertEqual(p.stderr.count("cannot load profile="), 1, p.stderr)
        self.assertIn("(every task of the node)", p.stderr)
        self.plugstack("onerror=warn")
        tasks, p = self.tasks("-n2", "-c1", f"--zenflow-bind=profile={missing}")
        self.assertEqual(sorted(tasks), [0, 1])
        self.assertEqual(p.stderr.count("cannot load profile="), 1, p.stderr)
        self.assertIn("the node's tasks left as Slurm bound them", p.stderr)


class TwoNodes(ClusterCase):
    """Two slurmd on this host: every node plans for its own tasks only."""
    NODES = 2

    def test_each_node_binds_its_local_tasks(self):
        tasks, p = self.tasks("-N2", "-n4", "-c1", "--zenflow-bind=verbose")
        self.assertEqual(sorted(tasks), [0, 1, 2, 3])
        lines = re.findall(r"zenflow-bind: (\S+) task (\d) \(rank (\d)\)", p.stderr)
        self.assertEqual(len(lines), 4, p.stderr)
        per_node = {}
        for node, local, rank in lines:
            per_node.setdefault(node, []).append((int(local), int(rank)))
        self.assertEqual(len(per_node), 2, p.stderr)
        for node, ids in per_node.items():
            self.assertEqual(sorted(l for l, _ in ids), [0, 1], node)
            cpus_of = [tasks[r].affinity for _, r in ids]
            self.assertNotEqual(cpus_of[0], cpus_of[1], f"{node}: tasks share a core")

    def test_a_refused_heterogeneous_step_runs_no_component(self):
        # srun decides once, for the first component only: the second, which asked for
        # --cpu-bind=none, ran bound by zenflow-bind (and the first was failed instead)
        ran = os.path.join(self.dir, "ran-")
        script = (f"srun -N1 -n1 -c1 touch {ran}a : -N1 -n1 -c1 --cpu-bind=none --zenflow-bind "
                  f"touch {ran}b; echo refused=$?; timeout 20 srun -N2 -n2 -c1 true; "
                  "echo next=$?")
        p = self.run_cmd("salloc", "-N2", "-n2", "-c1", "bash", "-c", script, check=False)
        self.assertRegex(p.stdout, r"refused=[1-9]")
        self.assertIn("next=0", p.stdout)
        self.assertIn("give only one of them", p.stderr)
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("ran-")], [],
                         p.stderr)

    def test_a_heterogeneous_step_left_to_cpu_bind_binds_no_component(self):
        # Under default=on srun's deferral reached the first component alone: A ran unbound
        # and B was bound by zenflow-bind against its own --cpu-bind=none
        self.plugstack("default=on")
        show = "bash -c 'echo {}=${{ZENFLOW_TRAIN_CPUS-unset}}'"
        script = (f"srun -N1 -n1 -c1 {show.format('A')} : -N1 -n1 -c1 --cpu-bind=none "
                  f"{show.format('B')}")
        p = self.run_cmd("salloc", "-N2", "-n2", "-c1", "bash", "-c", script)
        self.assertIn("keeps Slurm's binding", p.stderr)
        self.assertEqual(sorted(re.findall(r"[AB]=\S+", p.stdout)), ["A=unset", "B=unset"],
                         p.stdout + p.stderr)


if __name__ == "__main__":
    sys.exit(slurm_case.main())
