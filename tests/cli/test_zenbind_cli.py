"""The zenbind CLI end to end: plan --json on the seed layouts, the table, show, and errors."""
import glob
import json
import re
import os
import stat
import subprocess
import sys
import tempfile
import unittest

ZENBIND = sys.argv.pop(1)
SEED = "pack:2 [numa] core:16 pu:2(indexes=core:pack)"


def run(*args):
    return subprocess.run([ZENBIND, *args], capture_output=True, text=True, timeout=60)


def cpus(text):
    """A cpu-list ("0-2,5") as a set of ints."""
    out = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def plan(*args):
    r = run("plan", "--json", *args)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def most_node_room():
    """The most bytes a NUMA node here can give (MemFree + Inactive(file), as tune counts)."""
    most = 0
    for meminfo in glob.glob("/sys/devices/system/node/node*/meminfo"):
        with open(meminfo) as f:
            fields = dict(re.findall(r"Node \d+ (\S+):\s+(\d+) kB", f.read()))
        most = max(most, (int(fields.get("MemFree", 0)) + int(fields.get("Inactive(file)", 0)))
                   << 10)
    return most


def memory_cgroup(limit):
    """A new memory cgroup (v1's memory hierarchy, else cgroup v2) limited to `limit` bytes, as
    (directory, limit file name); None where none can be made (not root, no hierarchy)."""
    for mount, limit_file in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
                              ("/sys/fs/cgroup", "memory.max")):
        if not os.path.exists(os.path.join(mount, limit_file if "memory" in mount else
                                           "cgroup.controllers")):
            continue
        directory = os.path.join(mount, f"zb-cli-tune-{os.getpid()}")
        try:
            os.mkdir(directory)
        except OSError:
            return None
        try:
            with open(os.path.join(directory, limit_file), "w") as f:
                f.write(f"{limit}\n")
            return directory, limit_file
        except OSError:
            os.rmdir(directory)
            return None
    return None


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

    def test_hwlocs_own_reason_for_a_bad_synthetic_string(self):
        r = run("plan", "--tasks", "1", "--synthetic", "pack:2 core:2")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot use non-PU type for last level", r.stderr)
        self.assertIn("zenbind: cannot load the topology", r.stderr)

    def test_offload_mode(self):
        p = plan("--tasks", "2", "--synthetic", SEED, "--options", "mode=offload")
        t0 = p["tasks"][0]
        self.assertEqual((t0["train_cpus"], t0["opt_cpus"]), ("0-15,32-47", ""))
        self.assertEqual((t0["train_threads"], t0["opt_threads"]), (16, 0))

    def test_picture_colours_each_tasks_cpus(self):
        mask = "0,4-11,21-26,30-46"
        p = plan("--tasks", "2", "--synthetic", SEED, "--cpuset", mask)
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "plan.svg")
            r = run("plan", "--tasks", "2", "--synthetic", SEED, "--cpuset", mask,
                    "--picture", svg)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(svg) as f:
                text = f.read()
            # lstopo's native SVG: rect PU_<logical>_rect with its fill, text PU_<logical>_text_1
            # holding "P#<os index>".
            fills = dict(re.findall(r"id='PU_(\d+)_rect'[^>]* fill='([^']+)'", text))
            os_of = dict(re.findall(r"id='PU_(\d+)_text_1'[^>]*>P#(\d+)<", text))
            fill_of_cpu = {int(os_of[l]): f for l, f in fills.items()}
            self.assertEqual(len(fill_of_cpu), 64)
            seen = set()
            for t in p["tasks"]:
                for role in ("train_cpus", "opt_cpus"):
                    colours = {fill_of_cpu[c] for c in cpus(t[role])}
                    self.assertEqual(len(colours), 1, (t["task"], role, colours))
                    seen |= colours
                    self.assertIn(f"task {t['task']}: ", text)
                    self.assertIn(t[role], text, "the legend lists the CPUs")
            self.assertEqual(len(seen), 4, "training and optimizer of each task: 4 colours")
            outside = set(range(64)) - cpus(mask)
            self.assertEqual({fill_of_cpu[c] for c in outside}, {"rgb(255,255,255)"})
            png = os.path.join(d, "plan.png")
            r = run("plan", "--tasks", "2", "--synthetic", SEED, "--picture", png)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            # A bad name is a usage error found before any work, and a failed drawing prints no
            # plan a script could take for the command's result.
            for name in ("/plan.gif", "/.svg", "/.png"):
                r = run("plan", "--json", "--tasks", "2", "--synthetic", SEED, "--picture",
                        d + name)
                self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
                self.assertIn("NAME.svg or NAME.png", r.stderr)
            r = run("plan", "--json", "--tasks", "2", "--synthetic", SEED, "--picture",
                    d + "/missing-dir/plan.svg")
            self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
            self.assertIn("lstopo failed to draw", r.stderr)

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

    def test_off_says_the_plugin_would_not_bind(self):
        # srun --zenflow-bind=off binds nothing: the preview says so instead of a silent plan.
        on = plan("--tasks", "2", "--synthetic", SEED)
        off = plan("--tasks", "2", "--synthetic", SEED, "--options", "off")
        self.assertEqual(off["tasks"], on["tasks"])
        self.assertEqual(len(off["warnings"]), 1)
        self.assertTrue(off["warnings"][0].startswith("off: the plugin would leave"), off)
        r = run("plan", "--tasks", "2", "--synthetic", SEED, "--options", "off")
        self.assertIn("warning: off: the plugin would leave", r.stdout)
        self.assertEqual(plan("--tasks", "2", "--synthetic", SEED, "--options", "off,on"), on)

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

    def test_openmp_binding_is_refused_not_read_as_the_machine(self):
        # libgomp pins the process to its first place before main() where these are set: the
        # machine would read as one CPU, and tune would measure one core
        base = {k: v for k, v in os.environ.items()
                if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")}
        for var, value in (("OMP_PROC_BIND", "close"), ("OMP_PLACES", "cores"),
                           ("GOMP_CPU_AFFINITY", "0")):
            with tempfile.TemporaryDirectory() as where:
                for args in (["plan", "--tasks", "1"], ["show"],
                             ["tune", "--output", os.path.join(where, "p"), "--steps", "1"]):
                    r = subprocess.run([ZENBIND, *args], capture_output=True, text=True,
                                       timeout=60, env={**base, var: value})
                    self.assertEqual(r.returncode, 1, (var, args, r.stdout))
                    self.assertIn("env -u OMP_PROC_BIND", r.stderr)
                self.assertEqual(os.listdir(where), [])  # no profile of one core
        # a plan of a given cpuset reads nothing of this process; OMP_PROC_BIND=false binds none
        r = subprocess.run([ZENBIND, "plan", "--tasks", "1", "--cpuset", "0"], capture_output=True,
                           text=True, timeout=60, env={**base, "OMP_PROC_BIND": "close"})
        self.assertEqual(r.returncode, 0, r.stderr)
        plain, unbound = (subprocess.run([ZENBIND, "plan", "--tasks", "1", "--json"],
                                         capture_output=True, text=True, timeout=60, env=env)
                          for env in (base, {**base, "OMP_PROC_BIND": "false"}))
        self.assertEqual(json.loads(unbound.stdout)["allowed"], json.loads(plain.stdout)["allowed"])

    def test_topology_from_an_xml_export(self):
        # This machine exported by lstopo plans as the live machine does, for the same CPUs.
        allowed = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        with tempfile.TemporaryDirectory() as d:
            xml = os.path.join(d, "machine.xml")
            subprocess.run(["lstopo-no-graphics", "--of", "xml", xml], check=True, timeout=60)
            for tasks in ("1", "2"):
                live = plan("--tasks", tasks, "--cpuset", allowed)
                self.assertEqual(plan("--tasks", tasks, "--cpuset", allowed, "--topology", xml),
                                 live)
        # A hand-written export whose home nodes are not in topology order (see test_planner.c):
        # numa=ignore and numa=prefer differ.
        nvm = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "topologies",
                           "dram_and_nvm.xml")
        summary = lambda p: [(t["cpus"], t["nodes"]) for t in p["tasks"]]
        self.assertEqual(summary(plan("--tasks", "2", "--topology", nvm)),
                         [("0-1,4-5", "1-2"), ("2-3,6-7", "0")])
        self.assertEqual(summary(plan("--tasks", "2", "--topology", nvm, "--options",
                                      "numa=ignore")),
                         [("0-3", "0-1"), ("4-7", "0,2")])

    def test_table(self):
        r = run("plan", "--tasks", "8", "--synthetic", SEED)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(any(line.startswith("task") for line in lines))
        self.assertEqual(sum(1 for line in lines if line[:1].isdigit()), 8)


class GraceHopper(unittest.TestCase):
    """Two GH200 superchips (tests/topologies/README.md): 72 cores and one LPDDR5X node per
    package, and each GPU's HBM as a CPU-less NUMA node of subtype GPUMemory beside it. Runs on
    the arm64 build too (under qemu-user), which is how the planner and show are checked on an Arm
    topology without Arm hardware."""

    XML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "topologies",
                       "grace_hopper_2x.xml")
    PACKAGES = (cpus("0-71"), cpus("72-143"))

    def check_task(self, t, package, node, allowed):
        train, opt = cpus(t["train_cpus"]), cpus(t["opt_cpus"])
        self.assertFalse(train & opt, t)
        self.assertTrue(train | opt <= self.PACKAGES[package] & allowed, t)
        self.assertEqual((t["train_threads"], t["opt_threads"]), (len(train), len(opt)), t)
        # The optimizer's state in the package's LPDDR5X, never in a GPU's HBM (nodes 2 and 3).
        self.assertEqual(t["opt_mems"], str(node), t)
        self.assertEqual(t["nodes"], str(node), t)

    def test_one_task_per_superchip_beside_its_gpu(self):
        p = plan("--tasks", "2", "--topology", self.XML, "--gpu-nodes", "0,1")
        self.assertEqual(p["warnings"], [])
        for i, t in enumerate(p["tasks"]):
            self.check_task(t, i, i, cpus("0-143"))
            self.assertEqual(t["cores"], 72)

    def test_gpus_reported_on_their_hbm_nodes(self):
        # The driver may give a GH200 GPU its own HBM node: the GPU is still beside its package's
        # CPUs, which is no reason to warn. GPU 0 on node 3 (package 1), GPU 1 on node 2.
        p = plan("--tasks", "2", "--topology", self.XML, "--gpu-nodes", "3,2")
        self.assertEqual(p["warnings"], [])
        self.assertEqual([t["gpu_node"] for t in p["tasks"]], [3, 2])
        for i, t in enumerate(p["tasks"]):
            self.check_task(t, 1 - i, 1 - i, cpus("0-143"))

    def test_a_slurm_step_of_half_of_each_package(self):
        allowed = "0-35,72-107"
        p = plan("--tasks", "4", "--topology", self.XML, "--gpu-nodes", "0,0,1,1", "--cpuset",
                 allowed)
        used = set()
        for i, t in enumerate(p["tasks"]):
            self.check_task(t, i // 2, i // 2, cpus(allowed))
            used |= cpus(t["train_cpus"]) | cpus(t["opt_cpus"])
        self.assertEqual(used, cpus(allowed))

    def test_one_task_over_both_packages_keeps_state_off_hbm(self):
        (t,) = plan("--tasks", "1", "--topology", self.XML)["tasks"]
        self.assertIn(t["opt_mems"], ("0", "1"))
        self.assertEqual(cpus(t["nodes"]), {0, 1})

    def test_show_lists_the_gpu_memory_nodes(self):
        env = {**os.environ, "HWLOC_XMLFILE": self.XML, "HWLOC_THISSYSTEM": "1"}
        r = subprocess.run([ZENBIND, "show", "--json"], capture_output=True, text=True,
                           timeout=60, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = json.loads(r.stdout)
        self.assertEqual(d["machine"], "0-143")
        kinds = {n["node"]: (n["cpus"], n["cores"], n["pus_per_core"], n["kind"])
                 for n in d["nodes"]}
        self.assertEqual(kinds, {0: ("0-71", 72, 1, "DRAM"), 1: ("72-143", 72, 1, "DRAM"),
                                 2: ("0-71", 72, 1, "GPUMemory"),
                                 3: ("72-143", 72, 1, "GPUMemory")})


# A hybrid CPU (Intel's P-cores with two hardware threads beside single-threaded E-cores) in
# small: core 0 holds PUs 0-1, cores 1 and 2 one PU each.
HYBRID_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x0f" complete_cpuset="0x0f" allowed_cpuset="0x0f"
  nodeset="0x1" complete_nodeset="0x1" allowed_nodeset="0x1" gp_index="1">
  <object type="Package" os_index="0" cpuset="0x0f" complete_cpuset="0x0f" nodeset="0x1"
   complete_nodeset="0x1" gp_index="2">
   <object type="NUMANode" os_index="0" cpuset="0x0f" complete_cpuset="0x0f" nodeset="0x1"
    complete_nodeset="0x1" gp_index="3" local_memory="1073741824"/>
   <object type="Core" os_index="0" cpuset="0x03" complete_cpuset="0x03" gp_index="4">
    <object type="PU" os_index="0" cpuset="0x01" complete_cpuset="0x01" gp_index="5"/>
    <object type="PU" os_index="1" cpuset="0x02" complete_cpuset="0x02" gp_index="6"/>
   </object>
   <object type="Core" os_index="1" cpuset="0x04" complete_cpuset="0x04" gp_index="7">
    <object type="PU" os_index="2" cpuset="0x04" complete_cpuset="0x04" gp_index="8"/>
   </object>
   <object type="Core" os_index="2" cpuset="0x08" complete_cpuset="0x08" gp_index="9">
    <object type="PU" os_index="3" cpuset="0x08" complete_cpuset="0x08" gp_index="10"/>
   </object>
  </object>
 </object>
</topology>
"""


class Show(unittest.TestCase):
    def test_hardware_threads_of_a_hybrid_cpu(self):
        # 4 PUs over 3 cores is no "1 PU per core": the table gives the range, the JSON the most.
        with tempfile.TemporaryDirectory() as d:
            xml = os.path.join(d, "hybrid.xml")
            with open(xml, "w") as f:
                f.write(HYBRID_XML)
            env = {**os.environ, "HWLOC_XMLFILE": xml, "HWLOC_THISSYSTEM": "1"}
            show = lambda *args: subprocess.run([ZENBIND, "show", *args], capture_output=True,
                                                text=True, timeout=60, env=env)
            r = show("--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            (node,) = json.loads(r.stdout)["nodes"]
            self.assertEqual((node["cpus"], node["cores"], node["pus_per_core"]), ("0-3", 3, 2))
            r = show()
            self.assertEqual(r.returncode, 0, r.stderr)
            row = [line for line in r.stdout.splitlines() if line.startswith("0 ")]
            self.assertEqual(row[0].split()[3:5], ["3", "1-2"], r.stdout)


class Tune(unittest.TestCase):
    @unittest.skipIf(os.environ.get("ZB_TEST_QEMU_USER"), "qemu-user has no NUMA system calls")
    def test_tune_writes_a_profile_that_plan_reads(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "node.profile")
            # --max-cores 1 on a machine whose nodes have 2 or more cores: one figure per node.
            r = run("tune", "--output", out, "--elements", "16777216", "--steps", "2", "--json",
                    "--max-cores", "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            result = json.loads(r.stdout)
            self.assertEqual(result["profile"], out)
            # Progress with the time left, per core count; a busy node is said, and marked.
            self.assertRegex(r.stderr, r"node \d+: +1/\d+ cores .* \(about \d+ s left\)")
            self.assertIsInstance(result["trusted"], bool)
            self.assertEqual(result["trusted"], "warning:" not in r.stderr, r.stderr)
            self.assertGreaterEqual(len(result["nodes"]), 1)
            for node in result["nodes"]:
                self.assertEqual(len(node["gb_per_s"]), 1)
                self.assertEqual(node["saturate"], 1)
                self.assertGreater(node["gb_per_s"][0], 0)
            with open(out) as f:
                self.assertEqual(f.readline(), "zenbind-profile 1\n")
                rows = [line.split() for line in f if line.startswith("node ")]
            self.assertEqual([(int(r[1]), r[3], len(r[5].split(","))) for r in rows],
                             [(n["node"], "1", 1) for n in result["nodes"]])
            p = plan("--tasks", "1", "--options", "profile=" + out)
            self.assertEqual(len(p["tasks"]), 1)

    @unittest.skipIf(os.environ.get("ZB_TEST_QEMU_USER"), "qemu-user has no NUMA system calls")
    def test_tune_output_is_a_regular_file_replaced_where_it_is(self):
        quick = ["--elements", "16777216", "--steps", "1", "--max-cores", "1"]
        with tempfile.TemporaryDirectory() as d:
            # --json names the profile as a JSON string, whatever its characters.
            odd = os.path.join(d, 'a"b\\c.profile')
            r = run("tune", "--output", odd, "--json", *quick)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["profile"], odd)
            # A relative FILE is named by the absolute path that profile= takes.
            r = subprocess.run([ZENBIND, "tune", "--output", "rel.profile", *quick], cwd=d,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            written = os.path.join(os.path.realpath(d), "rel.profile")  # (getcwd's path)
            self.assertIn(f"profile written to {written}\n", r.stdout)
            p = plan("--tasks", "1", "--options", "profile=" + written)
            self.assertEqual(len(p["tasks"]), 1)
            # A link is followed: the file it names is replaced, the link stays.
            target, link = os.path.join(d, "target.profile"), os.path.join(d, "link.profile")
            with open(target, "w") as f:
                f.write("old\n")
            os.symlink(target, link)
            r = run("tune", "--output", link, *quick)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.islink(link))
            with open(target) as f:
                self.assertEqual(f.readline(), "zenbind-profile 1\n")
            # Never renamed over a pipe or a device (/dev/stdout, /dev/null as root).
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)
            r = run("tune", "--output", fifo, *quick)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("is not a regular file", r.stderr)
            self.assertNotIn("cores", r.stderr)
            self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
            # /dev/stdout into a pipe (captured here): a link to a pipe realpath cannot name
            r = run("tune", "--output", "/dev/stdout", *quick)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("--output /dev/stdout is not a regular file", r.stderr)
            os.symlink(os.path.join(d, "nowhere"), os.path.join(d, "dangling"))
            r = run("tune", "--output", os.path.join(d, "dangling"), *quick)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("cannot follow its symbolic link", r.stderr)

    @unittest.skipIf(os.environ.get("ZB_TEST_QEMU_USER"), "qemu-user has no NUMA system calls")
    @unittest.skipIf(len(os.sched_getaffinity(0)) < 2, "needs two allowed CPUs")
    def test_tune_refuses_fewer_threads_than_cores(self):
        # OpenMP capped at one thread would measure one core and report it as two.
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([ZENBIND, "tune", "--output", os.path.join(d, "p"), "--elements",
                                "16777216", "--steps", "1", "--max-cores", "2"],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "OMP_THREAD_LIMIT": "1"})
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("OpenMP ran 1 threads where 2 cores", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "p")))

    @unittest.skipIf(os.environ.get("ZB_TEST_QEMU_USER"), "qemu-user has no NUMA system calls")
    def test_tune_refuses_more_than_the_node_holds(self):
        # checked before anything is allocated: 256 GiB of state, the most --elements takes
        # (without the check: an allocation refused or, with overcommit, the OOM killer)
        if most_node_room() >= (1 << 38) + (64 << 20):
            self.skipTest("a NUMA node here can give 256 GiB: tune would measure it")
        with tempfile.TemporaryDirectory() as d:
            r = run("tune", "--output", os.path.join(d, "p"), "--elements", str(1 << 34))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertRegex(r.stderr, r"17179869184 elements need 262144 MiB on node \d+, "
                                       r"which has \d+ MiB to give \(")
            self.assertRegex(r.stderr, r"give --elements \d+ or fewer|needs at least 320 MiB")
            self.assertFalse(os.path.exists(os.path.join(d, "p")))

    @unittest.skipIf(os.environ.get("ZB_TEST_QEMU_USER"), "qemu-user has no NUMA system calls")
    def test_tune_refuses_what_its_memory_cgroup_cannot_hold(self):
        # as under srun in a job with ConstrainRAMSpace=yes: 256 MiB of state in a cgroup of
        # 200 MiB is refused, naming the limit (without the check the kernel kills tune)
        group = memory_cgroup(200 << 20)
        if group is None:
            self.skipTest("needs root and a writable memory cgroup hierarchy")
        directory, limit_file = group
        try:
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run(
                    ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', directory,
                     ZENBIND, "tune", "--output", os.path.join(d, "p"), "--elements",
                     "16777216", "--max-cores", "1", "--steps", "1"],
                    capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("16777216 elements need 256 MiB on node", r.stderr)
            self.assertIn("headroom under the memory cgroup limit of " +
                          os.path.join(directory, limit_file), r.stderr)
            self.assertIn("tuning needs at least 320 MiB there", r.stderr)
        finally:
            os.rmdir(directory)

    def test_tune_errors(self):
        r = run("tune")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--output FILE is required", r.stderr)
        # An output that cannot be written fails before any measuring (no progress line).
        # (/proc: a directory whose permissions say root may write, where no file can be made)
        for path in ("/nonexistent-dir/x.profile", "/proc/x.profile"):
            r = run("tune", "--output", path, "--steps", "1")
            self.assertEqual(r.returncode, 1)
            self.assertIn(f"cannot write {path}", r.stderr)
            self.assertNotIn("cores", r.stderr)
        with tempfile.TemporaryDirectory() as d:
            r = run("tune", "--output", d)
            self.assertEqual(r.returncode, 1)
            self.assertIn("is a directory", r.stderr)
        # Buffers that fit in the caches would measure them, not memory (zenbind(1): 16 Mi).
        r = run("tune", "--output", "/tmp/x.profile", "--elements", "10")
        self.assertEqual(r.returncode, 2)
        self.assertIn("16777216", r.stderr)


class Errors(unittest.TestCase):
    def check(self, args, code, text):
        r = run(*args)
        self.assertEqual(r.returncode, code, r.stderr)
        # One line of zenbind's own, the last; only hwloc's reason for a topology may precede it.
        lines = r.stderr.strip().splitlines()
        self.assertTrue(lines[-1].startswith("zenbind: "), r.stderr)
        self.assertIn(text, lines[-1])
        self.assertLessEqual(len(lines), 2 if "--synthetic" in args else 1, r.stderr)

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

    def test_empty_and_repeated_values(self):
        # An empty value is no silent "not given" (--synthetic "" planned this machine), and a
        # second value no silent replacement (a second --options dropped the first's keys).
        for flag in ("--synthetic", "--topology", "--cpuset", "--picture", "--gpu-nodes",
                     "--gpus"):
            self.check(["plan", "--tasks", "1", flag, ""], 2, flag + " needs a value")
        self.check(["plan", "--tasks", "1", "--topology="], 2, "--topology needs a value")
        self.check(["plan", "--tasks", "1", "--synthetic", SEED, "--options", "train=0.75",
                    "--options", "smt=opt"], 2, "--options is given twice")
        self.check(["plan", "--tasks", "1", "--tasks", "2"], 2, "--tasks is given twice")
        r = run("tune", "--output", "/tmp/x", "--steps", "1", "--steps", "2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--steps is given twice", r.stderr)
        # No options at all is the defaults, as an empty srun --zenflow-bind= is.
        self.assertEqual(plan("--tasks", "2", "--synthetic", SEED, "--options", ""),
                         plan("--tasks", "2", "--synthetic", SEED))

    def test_help_and_version(self):
        self.assertEqual(run("--help").returncode, 0)
        self.assertIn("--tasks", run("help", "plan").stdout)
        extra = run("help", "plan", "--tasks")  # help plan --tasks: not a plan, not ignored
        self.assertEqual((extra.returncode, extra.stdout), (2, ""))
        self.assertIn("help takes one command", extra.stderr)
        self.assertRegex(run("--version").stdout, r"^zenbind \d+\.\d+\.\d+")


if __name__ == "__main__":
    unittest.main()
