"""zenflow_bind.deepspeed: the plan from the environment, and the adapter against a module shaped
like DeepSpeed's ZenFlow (deepspeed.runtime.zenflow.zenflow_utils: _compute_zf_pt_affinity(
zf_optimizer) called by start_optimizer_process). DeepSpeed is not a Debian package; the fake
below is written here, with only the names and call structure the adapter checks."""
import datetime
import faulthandler
import json
import os
import sys
import tempfile
import textwrap
import unittest
import warnings

import torch

import zenflow_bind.deepspeed as zd

PLUGIN_ENV = {"ZENFLOW_TRAIN_CPUS": "0-1,8-9", "ZENFLOW_OPT_CPUS": "2-3",
              "ZENFLOW_OPT_THREADS": "2", "OMP_NUM_THREADS": "4"}
# another task of the same node: its own CPUs
OTHER_TASK_ENV = {"ZENFLOW_TRAIN_CPUS": "4-5", "ZENFLOW_OPT_CPUS": "6-7",
                  "ZENFLOW_OPT_THREADS": "2", "OMP_NUM_THREADS": "2"}
# PLUGIN_ENV as srun task 0 of step 7.0 has it
TASK_0 = dict(PLUGIN_ENV, SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_PROCID="0")
# what the plugin exports on an SMT node (zenbind plan --tasks 2 --synthetic
# "package:1 core:8 pu:2", task 0): two training cores with their siblings, one thread each
SMT_ENV = {"ZENFLOW_TRAIN_CPUS": "0-3", "ZENFLOW_OPT_CPUS": "4-7", "ZENFLOW_OPT_THREADS": "4",
           "OMP_NUM_THREADS": "2"}

SHAPED_LIKE_DEEPSPEED = """
calls = []

def _compute_zf_pt_affinity(zf_optimizer):
    calls.append("collective")          # DeepSpeed all_gathers here
    return [99], [98]

def start_optimizer_process(zf_optimizer):
    zf_affinity, pt_affinity = _compute_zf_pt_affinity(zf_optimizer)
    return zf_affinity, pt_affinity
"""


# deepspeed.initialize's signature, in part, and where it finds its config
SHAPED_LIKE_INITIALIZE = """
def initialize(args=None, model=None, optimizer=None, model_parameters=None, config=None,
               config_params=None):
    config = config if config is not None else config_params
    return "engine", config if config is not None else args.deepspeed_config
"""


class FakeDeepSpeed:
    """A deepspeed package on sys.path whose zenflow_utils holds `source` and whose __init__
    holds `init`."""

    def __init__(self, source, init=""):
        self.dir = tempfile.TemporaryDirectory()
        pkg = os.path.join(self.dir.name, "deepspeed", "runtime", "zenflow")
        os.makedirs(pkg)
        for d in ("deepspeed", "deepspeed/runtime", "deepspeed/runtime/zenflow"):
            open(os.path.join(self.dir.name, d, "__init__.py"), "w").close()
        with open(os.path.join(self.dir.name, "deepspeed", "__init__.py"), "w") as f:
            f.write(textwrap.dedent(init))
        with open(os.path.join(pkg, "zenflow_utils.py"), "w") as f:
            f.write(textwrap.dedent(source))

    def __enter__(self):
        sys.path.insert(0, self.dir.name)
        import deepspeed.runtime.zenflow.zenflow_utils as zu
        return zu

    def __exit__(self, *exc):
        sys.path.remove(self.dir.name)
        for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
            del sys.modules[name]
        self.dir.cleanup()


def quiet(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [str(w.message) for w in caught]


def two_ranks(rank, store, envs, where):
    """One rank of a gloo job whose ranks have the environments envs: what its ZenFlow split
    came to, or the error, written to where/rank<N>."""
    import torch.distributed as dist
    # A rank stuck for good (once in CI, in gloo or at start) shows its stack and ends, so the
    # test fails in minutes and says where, instead of reaching ctest's timeout silently
    faulthandler.dump_traceback_later(180, exit=True)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED) as zu:
            quiet(zd.use_plan, envs[rank])
            try:
                zf, _ = zu.start_optimizer_process(object())
                out = f"{'plan' if zf != [99] else 'deepspeed'} {zf}"
            except RuntimeError as e:
                out = str(e)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(where, f"rank{rank}"), "w") as f:
        f.write(out)
    faulthandler.cancel_dump_traceback_later()


class PlanFromEnviron(unittest.TestCase):
    def test_the_plugins_variables(self):
        plan = zd.plan_from_environ(PLUGIN_ENV)
        self.assertEqual(plan.train_cpus, [0, 1, 8, 9])
        self.assertEqual(plan.opt_cpus, [2, 3])
        self.assertEqual((plan.opt_threads, plan.train_threads), (2, 4))

    def test_training_threads_are_the_plugins_one_per_core(self):
        self.assertEqual(zd.plan_from_environ(SMT_ENV).train_threads, 2)
        self.assertEqual(zd.plan_from_environ(dict(SMT_ENV, OMP_NUM_THREADS="3,1"))
                         .train_threads, 3)  # nested levels: the outer one
        unset = {k: v for k, v in SMT_ENV.items() if k != "OMP_NUM_THREADS"}
        self.assertEqual(zd.plan_from_environ(unset).train_threads, 4)  # one per CPU listed

    def test_missing_or_bad_variables_say_why(self):
        cases = [({}, "not started by srun --zenflow-bind"),
                 ({"ZENFLOW_TRAIN_CPUS": "0-3"}, "mode=offload"),
                 (dict(PLUGIN_ENV, ZENFLOW_OPT_CPUS="2-"), "is not a cpu list"),
                 (dict(PLUGIN_ENV, ZENFLOW_OPT_CPUS="3-2"), "runs backwards"),
                 (dict(PLUGIN_ENV, ZENFLOW_OPT_THREADS="x"), "not a thread count"),
                 (dict(PLUGIN_ENV, ZENFLOW_OPT_THREADS="3"), "one thread per CPU"),
                 (dict(PLUGIN_ENV, OMP_NUM_THREADS="0"), "OMP_NUM_THREADS='0' is not"),
                 (dict(PLUGIN_ENV, OMP_NUM_THREADS="all"), "is not a thread count")]
        for env, why in cases:
            with self.assertRaises(zd.PlanUnavailable, msg=str(env)) as e:
                zd.plan_from_environ(env)
            self.assertIn(why, str(e.exception))


class UsePlan(unittest.TestCase):
    def setUp(self):
        self.threads = torch.get_num_threads()

    def tearDown(self):
        torch.set_num_threads(self.threads)

    def test_zenflow_takes_the_plugins_split_without_a_collective(self):
        with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED) as zu:
            torch.set_num_threads(1)
            plan, said = quiet(zd.use_plan, PLUGIN_ENV)
            self.assertIsNotNone(plan, said)
            self.assertEqual(zu.start_optimizer_process(object()), ([2, 3], [0, 1, 8, 9]))
            self.assertEqual(zu.calls, [], "DeepSpeed's all_gather path is not taken")
            self.assertEqual(torch.get_num_threads(), 4)
            again, _ = quiet(zd.use_plan, PLUGIN_ENV)  # idempotent
            self.assertIsNotNone(again)
            quiet(zd.use_plan, SMT_ENV)
            self.assertEqual(torch.get_num_threads(), 2, "one thread per training core")

    def test_no_plan_keeps_deepspeeds_split(self):
        with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED) as zu:
            plan, said = quiet(zd.use_plan, {})
            self.assertIsNone(plan)
            self.assertTrue(any("srun --zenflow-bind" in s for s in said), said)
            self.assertEqual(zu.start_optimizer_process(object()), ([99], [98]))
            self.assertEqual(zu.calls, ["collective"], "DeepSpeed's own path, collective too")

    def test_configs_without_a_zenflow_process_are_refused(self):
        zenflow = {"topk_ratio": 0.1, "overlap_step": True}
        refused = {
            "overlap_step": ({"zero_optimization": {"zenflow": dict(zenflow,
                                                                     overlap_step=False)}},
                             "overlap_step is false"),
            "no zenflow": ({"zero_optimization": {"stage": 2}}, "no zero_optimization.zenflow"),
            "zenflow null": ({"zero_optimization": {"zenflow": None}},
                             "no zero_optimization.zenflow"),
            # DeepSpeed's old form of stage 1: no section to look into
            "zero true": ({"zero_optimization": True}, "no zero_optimization.zenflow"),
            # ZenFlow with DeepSpeed's defaults, and a switch written as a string
            "zenflow empty": ({"zero_optimization": {"zenflow": {}}}, "overlap_step is false"),
            "overlap_step string": ({"zero_optimization": {"zenflow": dict(
                zenflow, overlap_step="False")}}, "overlap_step is false"),
            "superoffload": ({"zero_optimization": {"stage": 3, "offload_optimizer": {
                "device": "cpu", "super_offload": True, "cpuadam_cores_perc": 0.8}}},
                "SuperOffload"),
            "superoffload string": ({"zero_optimization": {"zenflow": zenflow,
                                                           "offload_optimizer": {
                                                               "super_offload": "true"}}},
                                    "SuperOffload"),
        }
        for name, (config, says) in refused.items():
            with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED) as zu:
                before = zu._compute_zf_pt_affinity
                plan, said = quiet(zd.use_plan, PLUGIN_ENV, config)
                self.assertIsNone(plan, name)
                self.assertTrue(any(says in s and "mode=offload" in s for s in said),
                                (name, said))
                self.assertIs(zu._compute_zf_pt_affinity, before, name)
        with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED) as zu, tempfile.NamedTemporaryFile(
                "w", suffix=".json") as f:
            json.dump({"zero_optimization": {"zenflow": dict(zenflow,
                                                              pt_reserved_cores_perc=0.5)}}, f)
            f.flush()
            plan, said = quiet(zd.use_plan, PLUGIN_ENV, f.name)  # a path works too
            self.assertIsNotNone(plan, said)
            self.assertTrue(any("pt_reserved_cores_perc=0.5 is not used" in s for s in said),
                            said)

    def test_initialize_checks_the_config_it_is_given(self):
        # use_plan() without config: deepspeed.initialize names the configs whose optimizer
        # CPUs would stay idle, wherever DeepSpeed takes the config from, and still runs.
        zenflow = {"zenflow": {"overlap_step": True}}
        idle = {"zero_optimization": {"zenflow": {"overlap_step": False}}}
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(idle, f)
            f.flush()
            calls = [((), {"config": idle}), ((), {"config_params": idle}),
                     ((type("Args", (), {"deepspeed_config": f.name})(),), {})]
            for args, kwargs in calls:
                with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED, SHAPED_LIKE_INITIALIZE):
                    plan, _ = quiet(zd.use_plan, PLUGIN_ENV)
                    self.assertIsNotNone(plan)
                    import deepspeed
                    out, said = quiet(lambda: deepspeed.initialize(*args, **kwargs))
                    self.assertEqual(out[0], "engine")
                    self.assertTrue(any("overlap_step is false" in s and "[2, 3] stay idle" in s
                                        for s in said), (kwargs, said))
        with FakeDeepSpeed(SHAPED_LIKE_DEEPSPEED, SHAPED_LIKE_INITIALIZE):
            quiet(zd.use_plan, PLUGIN_ENV)
            quiet(zd.use_plan, PLUGIN_ENV)  # twice: wrapped once
            import deepspeed
            _, said = quiet(lambda: deepspeed.initialize(config={"zero_optimization": zenflow}))
            self.assertEqual(said, [])
            _, said = quiet(lambda: deepspeed.initialize(config={"zero_optimization": {
                "zenflow": {"overlap_step": True, "pt_reserved_cores_perc": 0.3}}}))
            self.assertEqual(len(said), 1)
            self.assertIn("pt_reserved_cores_perc=0.3 is not used", said[0])
            # DeepSpeed reads hjson and base64 configs too: not this adapter's to refuse
            for config in ("eyJ0cmFpbl9iYXRjaF9zaXplIjogOH0=", "/no/such/ds_config.json"):
                out, said = quiet(lambda: deepspeed.initialize(config=config))
                self.assertEqual(out[0], "engine")
                self.assertEqual(len(said), 1, said)
                self.assertIn("was not checked", said[0])

    def test_ranks_with_and_without_a_plan_fail_together(self):
        with tempfile.TemporaryDirectory() as where:
            for envs, want in (([PLUGIN_ENV, {}], "1 ranks run under srun --zenflow-bind and "
                                                   "1 do not"),
                               ([PLUGIN_ENV, OTHER_TASK_ENV], ("plan [2, 3]", "plan [6, 7]")),
                               # one task's plan inherited by two ranks (torchrun inside it)
                               ([TASK_0, TASK_0], "ranks 0 and 1 hold the plan of the same "
                                                  "srun task (job 7, step 0, task 0)"),
                               # two tasks on the same cores (more tasks than cores: the plugin
                               # shares them round-robin, with a warning): each its own plan
                               ([TASK_0, dict(TASK_0, SLURM_PROCID="1")], "plan [2, 3]"),
                               ([{}, {}], "deepspeed [99]")):
                import torch.multiprocessing as mp
                store = tempfile.mktemp(dir=where)
                mp.spawn(two_ranks, args=(store, envs, where), nprocs=2, join=True)
                for rank in (0, 1):
                    with open(os.path.join(where, f"rank{rank}")) as f:
                        said = want if isinstance(want, str) else want[rank]
                        self.assertIn(said, f.read(), (rank, envs))

    def test_unknown_deepspeed_internals_change_nothing(self):
        shapes = {
            "renamed": SHAPED_LIKE_DEEPSPEED.replace("_compute_zf_pt_affinity", "_split_cpus"),
            "other parameters": SHAPED_LIKE_DEEPSPEED.replace(
                "def _compute_zf_pt_affinity(zf_optimizer)",
                "def _compute_zf_pt_affinity(zf_optimizer, ranks)"),
            "not called": SHAPED_LIKE_DEEPSPEED.replace(
                "zf_affinity, pt_affinity = _compute_zf_pt_affinity(zf_optimizer)",
                "zf_affinity, pt_affinity = [1], [0]"),
        }
        for name, source in shapes.items():
            with FakeDeepSpeed(source) as zu:
                before = getattr(zu, "_compute_zf_pt_affinity", None)
                plan, said = quiet(zd.use_plan, PLUGIN_ENV)
                self.assertIsNone(plan, name)
                self.assertTrue(any("nothing changed" in s for s in said), (name, said))
                self.assertIs(getattr(zu, "_compute_zf_pt_affinity", None), before, name)

    def test_without_deepspeed_nothing_changes(self):
        plan, said = quiet(zd.use_plan, PLUGIN_ENV)
        self.assertIsNone(plan)
        self.assertTrue(any("cannot import deepspeed" in s for s in said), said)


if __name__ == "__main__":
    unittest.main(verbosity=2)
