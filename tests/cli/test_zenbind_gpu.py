"""zenbind plan's GPU flags end to end: --gpu-nodes on a DGX A100-like node, --gpus resolved
through a fake sysfs (--gpu-root) or a GPU map (--gpumap), the JSON and table columns, errors."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ZENBIND = sys.argv.pop(1)
# Two packages of four NUMA nodes (one per L3), two cores each: node n holds CPUs 2n, 2n+1.
DGX = "pack:2 l3:4 [numa] core:2 pu:1"


def run(*args):
    return subprocess.run([ZENBIND, *args], capture_output=True, text=True, timeout=60)


def plan(*args):
    r = run("plan", "--json", *args)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class GpuPlan(unittest.TestCase):
    def test_gpu_nodes_on_a_dgx_layout(self):
        p = plan("--tasks", "8", "--synthetic", DGX, "--gpu-nodes", "3,3,1,1,7,7,5,5")
        nodes = [t["nodes"] for t in p["tasks"]]
        self.assertEqual(nodes[0::2], ["3", "1", "7", "5"])
        for i in (1, 3, 5, 7):
            self.assertNotEqual(nodes[i], nodes[i - 1])
            self.assertEqual(int(nodes[i]) // 4, int(nodes[i - 1]) // 4, "same package")
        self.assertEqual([t["gpu_node"] for t in p["tasks"]], [3, 3, 1, 1, 7, 7, 5, 5])
        self.assertEqual([t["gpu"] for t in p["tasks"]], [None] * 8)
        self.assertEqual(sum("whose shares went to earlier tasks" in w for w in p["warnings"]), 4)
        # Without GPUs the nodes go in order, and the JSON says there are none.
        p = plan("--tasks", "8", "--synthetic", DGX)
        self.assertEqual([t["nodes"] for t in p["tasks"]], [str(i) for i in range(8)])
        self.assertEqual({t["gpu_node"] for t in p["tasks"]}, {None})

    def test_gpus_through_a_fake_sysfs_and_a_map(self):
        with tempfile.TemporaryDirectory() as root:
            for bus, node in (("0000:07:00.0", "6"), ("0000:0f:00.0", "2")):
                dev = os.path.join(root, "sys", "bus", "pci", "devices", bus)
                write(os.path.join(dev, "class"), "0x030200\n")
                write(os.path.join(dev, "vendor"), "0x10de\n")
                write(os.path.join(dev, "numa_node"), node + "\n")
            p = plan("--tasks", "2", "--synthetic", DGX, "--cpuset", "0-15", "--gpus", "0,1",
                     "--gpu-root", root)
            self.assertEqual([(t["gpu"], t["gpu_node"]) for t in p["tasks"]], [(0, 6), (1, 2)])
            self.assertEqual([t["nodes"] for t in p["tasks"]], ["4-7", "0-3"])
            table = run("plan", "--tasks", "2", "--synthetic", DGX, "--gpus", "1",
                        "--gpu-root", root)
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("GPU", table.stdout.splitlines()[2])
            self.assertIn("1 (node 2)", table.stdout)

            gpumap = os.path.join(root, "gpus.map")
            write(gpumap, "0 1\n1 0 0000:0f:00.0\n")
            p = plan("--tasks", "2", "--synthetic", DGX, "--cpuset", "0-3", "--gpus", "0,1",
                     "--gpumap", gpumap)
            self.assertEqual([t["nodes"] for t in p["tasks"]], ["1", "0"])

            write(gpumap, "0 1\nzero 0\n")
            r = run("plan", "--tasks", "2", "--synthetic", DGX, "--gpus", "0,1",
                    "--gpumap", gpumap)
            self.assertEqual(r.returncode, 1)
            self.assertIn("line 2: bad GPU index 'zero'", r.stderr)

    def test_usage_errors(self):
        for args, text in (
                (["--gpu-nodes", "1,x"], "'x' is neither a NUMA node number nor '-'"),
                (["--gpu-nodes", "1"], "--gpu-nodes lists 1 tasks, --tasks says 2"),
                (["--gpus", "0,a"], "bad GPU list"),
                (["--gpu-root", "/"], "--gpus, which is missing"),
                (["--gpus", "0", "--gpu-nodes", "0,0"], "not both"),
                (["--gpus", "0", "--gpu-root", "/", "--gpumap", "/x"], "not both")):
            r = run("plan", "--tasks", "2", "--synthetic", DGX, *args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(text, r.stderr)


if __name__ == "__main__":
    unittest.main()
