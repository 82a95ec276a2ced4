#!/usr/bin/python3
"""GPU-aware placement on a real Slurm: gres GPUs backed by files the test creates, found by the
plugin in a fake sysfs tree, on a node that slurmd and the plugin both see as two NUMA nodes.

    test_gpu.py PLUGIN_SO --task-plugin cgroup|affinity [unittest args]

This host has one NUMA node and two cores, so the cluster's slurmd (and the slurmstepd it
starts, where the plugin plans) gets the topology of tests/topologies/gh200_two_cores.xml
(HWLOC_XMLFILE): shaped like two NVIDIA GH200 superchips, two packages with one core, a DRAM node
(0 and 1, CPU numbers 0 and 1 as on the host) and a CPU-less GPUMemory node (2 and 3) each. The
plugin's GPU discovery is pointed at a fake tree (ZENFLOW_BIND_GPU_ROOT): GPU 0 on NUMA node 1,
GPU 1 on node 0, the reverse of topology order. gres.conf's File= entries are character devices
the test makes (mknod, /dev/null's numbers), as slurmd requires. A task bound beside its GPU
therefore runs on the other core than the one it would get without GPU placement.
"""
import os
import re
import shutil
import stat
import sys
import tempfile

import slurm_case
from slurm_case import REPORT, ClusterCase, cpus

TOPOLOGY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "topologies",
                        "gh200_two_cores.xml")
# GPU index -> (PCI address, NUMA node); NUMA node n holds CPU n in TOPOLOGY (n = 0, 1).
GPUS = [("0000:41:00.0", 1), ("0000:c1:00.0", 0)]
DAEMON_VARIABLES = ("HWLOC_XMLFILE", "HWLOC_THISSYSTEM", "ZENFLOW_BIND_GPU_ROOT",
                    "ZB_CLUSTER_GRES_GPUS")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class GpuPlacement(ClusterCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="zb-gpu-")
        devices = []
        for i, (bus, node) in enumerate(GPUS):
            # slurmd wants a character device for each File= entry (it only stats it): /dev/null's
            # numbers under another name.
            devices.append(os.path.join(cls.root, "dev", f"nvidia{i}"))
            os.makedirs(os.path.dirname(devices[-1]), exist_ok=True)
            os.mknod(devices[-1], 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            pci = os.path.join(cls.root, "sys", "bus", "pci", "devices", bus)
            write(os.path.join(pci, "class"), "0x030200\n")
            write(os.path.join(pci, "vendor"), "0x10de\n")
            write(os.path.join(pci, "numa_node"), f"{node}\n")
            write(os.path.join(pci, "local_cpulist"), f"{node}\n")
        # A BMC's VGA function, which is no GPU.
        vga = os.path.join(cls.root, "sys", "bus", "pci", "devices", "0000:03:00.0")
        write(os.path.join(vga, "class"), "0x030000\n")
        write(os.path.join(vga, "vendor"), "0x1a03\n")
        # The daemons inherit the environment cluster.sh starts them with; the jobs must not.
        saved = {v: os.environ.get(v) for v in DAEMON_VARIABLES}
        os.environ.update(HWLOC_XMLFILE=TOPOLOGY, HWLOC_THISSYSTEM="1",
                          ZENFLOW_BIND_GPU_ROOT=cls.root, ZB_CLUSTER_GRES_GPUS=" ".join(devices))
        try:
            super().setUpClass()
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
        for var in DAEMON_VARIABLES:
            cls.env.pop(var, None)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.root, ignore_errors=True)

    def setUp(self):
        self.plugstack("verbose")

    def gpu_map(self, text):
        path = os.path.join(self.root, "gpus.map")
        write(path, text)
        return path

    def assert_beside_gpus(self, tasks, expected_gpu):
        """Task i runs on the CPU of the NUMA node of GPU expected_gpu[i]."""
        self.assertEqual(sorted(tasks), list(range(len(expected_gpu))))
        for i, gpu in enumerate(expected_gpu):
            node = GPUS[gpu][1]
            self.assertEqual(tasks[i].affinity, {node},
                             f"task {i} drives GPU {gpu} on NUMA node {node}")
            self.assertEqual(cpus(tasks[i].train), {node})
            self.assertEqual(tasks[i].mems, str(node))

    def test_the_cluster_sees_two_numa_nodes(self):
        # Without GPUs, task i gets node i: the fake topology is in force in slurmstepd.
        tasks, p = self.tasks("-n2", "--zenflow-bind")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{0}, {1}], p.stderr)
        self.assertNotIn("GPU", p.stderr)

    def test_step_gpus_place_each_rank_beside_its_gpu(self):
        # Every task sees SLURM_STEP_GPUS=0,1 (no per-task binding): rank i drives GPU i.
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--zenflow-bind")
        self.assert_beside_gpus(tasks, [0, 1])
        for i in (0, 1):
            self.assertRegex(p.stderr, rf"task {i} \(rank {i}\).*, GPU {i} on node {GPUS[i][1]}")
        self.assertNotRegex(p.stderr, r"warning: .*GPU")

    def test_gpus_per_task_binding(self):
        # --gpus-per-task=1: Slurm narrows each task's SLURM_STEP_GPUS to its own GPU, which is the
        # one the plan assumed, so no task warns.
        tasks, p = self.tasks("-n2", "--gpus-per-task=1", "--zenflow-bind")
        self.assert_beside_gpus(tasks, [0, 1])
        self.assertNotRegex(p.stderr, r"warning: .*drives GPU")

    def test_gpu_bind_map_that_the_plan_cannot_know_warns(self):
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--gpu-bind=map_gpu:1,0", "--zenflow-bind")
        self.assert_beside_gpus(tasks, [0, 1])  # every task plans with the step-wide rule
        self.assertRegex(p.stderr, r"warning: task 0 drives GPU 1 \(SLURM_STEP_GPUS=1\)")

    def test_step_without_gpus_in_a_gpu_job_keeps_topology_order(self):
        # The batch script's environment holds SLURM_JOB_GPUS=0 (GPU 0 is on node 1); an srun step
        # with no GPUs of its own inherits it and must not be placed by it.
        text = self.sbatch_and_wait(
            "--gres=gpu:1", f"srun -l -n2 -c1 --gres=none --zenflow-bind bash -c '{REPORT}'\n",
            "-n2", "-c1")
        affinity = {int(m.group(1)): cpus(m.group(2).split("|")[-1])
                    for m in re.finditer(r"(?m)^(\d+): env=(.*)$", text)}
        self.assertEqual(affinity, {0: {0}, 1: {1}}, text)
        self.assertNotIn("GPU 0 on node", text)

    def test_the_batch_step_is_placed_by_the_jobs_gpus(self):
        # sbatch run inside another job's GPU step carries that step's SLURM_STEP_GPUS (here GPU
        # 1, on node 0) into the batch step, which slurmstepd gives SLURM_JOB_GPUS only: GPU 0,
        # on node 1
        env = dict(self.env, SLURM_STEP_GPUS="1")
        text = self.sbatch_and_wait("--zenflow-bind=batch,verbose", "true\n", "--gres=gpu:1",
                                    env=env)
        self.assertRegex(text, r"GPU 0 on node 1")
        self.assertNotIn("GPU 1 on node", text)

    def test_gpu_ignore_keeps_topology_order(self):
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--zenflow-bind=gpu=ignore")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{0}, {1}], p.stderr)

    def test_two_tasks_share_one_gpu(self):
        # Slurm gives the step the first free GPU, GPU 0 on node 1: task 0 goes there, task 1 to
        # the nearest node left, with a warning (topology order would put task 0 on node 0).
        tasks, p = self.tasks("-n2", "--gres=gpu:1", "--zenflow-bind")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{1}, {0}], p.stderr)
        self.assertRegex(p.stderr, r"warning: task 1: GPU on NUMA node 1, whose shares went to "
                                   r"earlier tasks: share on NUMA node 0")

    def test_admin_map_wins_over_discovery(self):
        self.plugstack("verbose,gpumap=" + self.gpu_map("# reversed\n0 0\n1 1 0000:c1:00.0\n"))
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--zenflow-bind")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{0}, {1}], p.stderr)
        self.assertRegex(p.stderr, r"task 0 .*, GPU 0 on node 0")

    def test_gpus_on_their_hbm_nodes_are_beside_their_package(self):
        # A Grace Hopper's driver may give each GPU its own HBM node: GPU 0 on node 3 (package 1's
        # HBM), GPU 1 on node 2. Each task goes to that package's core and DRAM, without warning.
        self.plugstack("verbose,gpumap=" + self.gpu_map("0 3\n1 2\n"))
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--zenflow-bind")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{1}, {0}], p.stderr)
        self.assertEqual([tasks[i].mems for i in (0, 1)], ["1", "0"], p.stderr)
        self.assertRegex(p.stderr, r"task 0 .*, GPU 0 on node 3")
        self.assertNotRegex(p.stderr, r"warning: .*GPU")

    def test_bad_map_falls_back_with_a_warning(self):
        self.plugstack("gpumap=" + self.gpu_map("0 0\n0 1\n"))
        tasks, p = self.tasks("-n2", "--gres=gpu:2", "--zenflow-bind")
        self.assertEqual([tasks[i].affinity for i in (0, 1)], [{0}, {1}], p.stderr)
        self.assertRegex(p.stderr, r"warning: GPU placement off: .*line 2: GPU 0 is listed twice")
        self.assertEqual(p.stderr.count("GPU placement off"), 1, "said once per node")


if __name__ == "__main__":
    sys.exit(slurm_case.main())
