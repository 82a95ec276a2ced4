"""Make DeepSpeed use the CPUs that srun --zenflow-bind planned.

DeepSpeed's ZenFlow splits the CPUs of its optimizer process and of PyTorch itself out of the
process's *current affinity* (zenflow_utils._compute_zf_pt_affinity: an all_gather of every
rank's affinity, a "soft bind" by global rank, then pt_reserved_cores_perc). Under
srun --zenflow-bind the task's affinity is already only its training CPUs, so ZenFlow would split
those again and leave ZENFLOW_OPT_CPUS idle. One call before deepspeed.initialize fixes that:

    import zenflow_bind.deepspeed
    zenflow_bind.deepspeed.use_plan()          # then deepspeed.initialize(...) as usual

ZenFlow's optimizer process then runs on ZENFLOW_OPT_CPUS (one thread per CPU listed, which is
ZENFLOW_OPT_THREADS) and PyTorch on ZENFLOW_TRAIN_CPUS with torch.set_num_threads to the
plugin's OMP_NUM_THREADS (one thread per training core). The
decision depends only on the environment and on DeepSpeed's code, so every rank of a step makes
the same one, and no collective is left for some ranks and not others. The DeepSpeed config is
checked where deepspeed.initialize receives it (or at once, given to use_plan): one in which no
ZenFlow optimizer process runs, and so the plan's optimizer CPUs would stay idle, is named with
what to run instead.

DeepSpeed ZeRO-Offload without ZenFlow (DeepSpeedCPUAdam inside the training process) needs no
call: run it under srun --zenflow-bind=mode=offload, which gives each task its whole share and
OMP_NUM_THREADS to match.
"""

import inspect
import json
import os
import warnings

__all__ = ["Plan", "PlanUnavailable", "plan_from_environ", "use_plan"]


class PlanUnavailable(Exception):
    """The environment holds no usable zenflow-bind plan; the message says why."""


class Plan:
    """The CPUs srun --zenflow-bind gave this task."""

    def __init__(self, train_cpus, opt_cpus, opt_threads, train_threads=None):
        self.train_cpus = train_cpus
        self.opt_cpus = opt_cpus
        self.opt_threads = opt_threads
        # the plugin's OMP_NUM_THREADS: one thread per training core, so fewer than
        # train_cpus where they hold SMT siblings
        self.train_threads = len(train_cpus) if train_threads is None else train_threads

    def __repr__(self):
        return (f"Plan(train_cpus={self.train_cpus}, opt_cpus={self.opt_cpus}, "
                f"opt_threads={self.opt_threads}, train_threads={self.train_threads})")


def _cpulist(name, text):
    """Linux cpu-list ("0-3,8,10-11") -> sorted list of ints; PlanUnavailable if malformed."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise PlanUnavailable(f"{name}={text!r} is not a cpu list such as 0-3,8")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise PlanUnavailable(f"{name}={text!r}: range {part} runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _omp_threads(value):
    """The training thread count of OMP_NUM_THREADS (its first level where it lists several),
    None where it is unset; PlanUnavailable where it is no count."""
    if value is None:
        return None
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise PlanUnavailable(f"OMP_NUM_THREADS={value!r} is not a thread count")
    return int(first)


def plan_from_environ(environ=None):
    """The plan the plugin exported into this task, or PlanUnavailable saying what is missing."""
    env = os.environ if environ is None else environ
    train, opt = env.get("ZENFLOW_TRAIN_CPUS"), env.get("ZENFLOW_OPT_CPUS")
    if not train:
        raise PlanUnavailable("ZENFLOW_TRAIN_CPUS is not set: this task was not started by "
                              "srun --zenflow-bind")
    if not opt:
        raise PlanUnavailable("ZENFLOW_OPT_CPUS is not set: the step runs --zenflow-bind="
                              "mode=offload (the optimizer runs in-process; nothing to split)")
    opt_cpus = _cpulist("ZENFLOW_OPT_CPUS", opt)
    plan = Plan(_cpulist("ZENFLOW_TRAIN_CPUS", train), opt_cpus, len(opt_cpus),
                _omp_threads(env.get("OMP_NUM_THREADS")))
    threads = env.get("ZENFLOW_OPT_THREADS")
    if threads is not None:
        if not threads.isdigit() or int(threads) < 1:
            raise PlanUnavailable(f"ZENFLOW_OPT_THREADS={threads!r} is not a thread count")
        if int(threads) != len(plan.opt_cpus):
            # ZenFlow runs one optimizer thread per CPU of its affinity; a plan with another
            # count (none that the plugin makes today) cannot be expressed through it.
            raise PlanUnavailable(f"ZENFLOW_OPT_THREADS={threads} differs from the "
                                  f"{len(plan.opt_cpus)} CPUs of ZENFLOW_OPT_CPUS, and ZenFlow "
                                  "runs one thread per CPU")
    return plan


def _zenflow_utils():
    """DeepSpeed's ZenFlow module if its internals are the ones this adapter knows, else a
    reason. Checked, not assumed: the function it replaces must exist with the same parameters
    and be the one start_optimizer_process calls."""
    try:
        from deepspeed.runtime.zenflow import zenflow_utils as zu
    except ImportError as e:
        return None, f"cannot import deepspeed.runtime.zenflow.zenflow_utils ({e})"
    compute = getattr(zu, "_compute_zf_pt_affinity", None)
    start = getattr(zu, "start_optimizer_process", None)
    if not callable(compute) or not callable(start):
        return None, ("deepspeed.runtime.zenflow.zenflow_utils has no _compute_zf_pt_affinity "
                      "or start_optimizer_process")
    if hasattr(compute, "_zenflow_bind_original"):
        return zu, None  # already ours (use_plan called twice)
    if list(inspect.signature(compute).parameters) != ["zf_optimizer"]:
        return None, (f"_compute_zf_pt_affinity{inspect.signature(compute)} is not "
                      "(zf_optimizer)")
    code = getattr(start, "__code__", None)
    if code is None or "_compute_zf_pt_affinity" not in code.co_names:
        return None, "start_optimizer_process does not call _compute_zf_pt_affinity"
    return zu, None


def _section(config, key):
    """config[key] as a dict: {} where it is absent or not a JSON object."""
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def _flag(value):
    """A config switch as DeepSpeed's pydantic models read it: "false", "0", "off" and "no" are
    false, as are false, 0 and null."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "f", "no", "n", "off")
    return bool(value)


def _config_problems(config):
    """(why the plan cannot serve this DeepSpeed config, or None; notes on settings it
    overrides). config: the dict or JSON path deepspeed.initialize gets, or None (unknown)."""
    if config is None:
        return None, []
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            # DeepSpeed also takes hjson files and base64-encoded JSON: its own to read and judge
            return None, [f"the DeepSpeed config is not a JSON file this adapter can read "
                          f"({type(e).__name__}), so it was not checked"]
    if not isinstance(config, dict):
        return None, ["the DeepSpeed config is not a JSON object, so it was not checked"]
    zero = _section(config, "zero_optimization")  # true (ZeRO stage 1, DeepSpeed's old form): {}
    offload = _section(zero, "offload_optimizer")
    if _flag(offload.get("super_offload")):
        return ("SuperOffload splits the CPUs itself (cpuadam_cores_perc) and this adapter does "
                "not drive it: run srun --zenflow-bind=mode=offload, which gives each task its "
                "whole share, and give torch the training part's thread count "
                "(zenflow_bind.deepspeed(3))"), []
    if zero.get("zenflow") is None:
        return ("the config has no zero_optimization.zenflow section, so no ZenFlow optimizer "
                "process runs: for DeepSpeedCPUAdam in the training process run "
                "srun --zenflow-bind=mode=offload"), []
    zenflow = _section(zero, "zenflow")
    if not _flag(zenflow.get("overlap_step")):
        return ("zero_optimization.zenflow.overlap_step is false (DeepSpeed's default): ZenFlow "
                "then steps in the training process and starts no optimizer process, so "
                "ZENFLOW_OPT_CPUS would stay idle; set overlap_step to true, or run "
                "srun --zenflow-bind=mode=offload"), []
    notes = []
    if "pt_reserved_cores_perc" in zenflow:
        notes.append(f"zero_optimization.zenflow.pt_reserved_cores_perc="
                     f"{zenflow['pt_reserved_cores_perc']} is not used: the plan's training "
                     "share decides (srun --zenflow-bind=train=N|F)")
    return None, notes


def _config_of(args, kwargs):
    """The config deepspeed.initialize(args=None, model=None, ..., config=None, ...,
    config_params=None) was given, where DeepSpeed itself looks for it; None if it has none that
    can be read here (a DeepSpeedConfig object, say)."""
    config = kwargs.get("config")
    if config is None:
        config = kwargs.get("config_params")
    cli = kwargs.get("args", args[0] if args else None)
    for name in ("deepspeed_config", "deepscale_config"):
        if config is None:
            config = getattr(cli, name, None)
    return config if isinstance(config, (dict, str, os.PathLike)) else None


def _watch_initialize(plan):
    """Wrap deepspeed.initialize so that the config it gets is checked against the plan: a
    warning names a config in which ZenFlow starts no optimizer process (overlap_step false,
    SuperOffload, no zenflow section) or a setting the plan overrides. False if deepspeed has no
    initialize to wrap."""
    try:
        import deepspeed
    except ImportError:
        return False
    current = getattr(deepspeed, "initialize", None)
    if not callable(current):
        return False
    original = getattr(current, "_zenflow_bind_original", current)

    def initialize(*args, **kwargs):
        why, notes = _config_problems(_config_of(args, kwargs))
        said = [f"{why}; the plan's optimizer CPUs {plan.opt_cpus} stay idle"] if why else notes
        for text in said:
            warnings.warn(f"zenflow_bind.deepspeed: {text}", stacklevel=2)
        return original(*args, **kwargs)

    initialize.__doc__, initialize.__wrapped__ = original.__doc__, original
    initialize._zenflow_bind_original = original
    deepspeed.initialize = initialize
    return True


def _task_of(env):
    """The srun task whose environment this is (job, step, task rank), None outside one: the
    plugin plans per task, so two ranks with the same one share one task's plan."""
    ids = tuple(env.get(k) for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID"))
    return ids if all(ids) else None


def _agree(plan, task):
    """Every rank learns every rank's plan, in one collective that all of them make, and fails
    with the others where the plans cannot serve: only some ranks have one (the unplanned ones
    would wait in DeepSpeed's all_gather for ranks that never come), or two ranks hold the plan
    of the same srun task (torchrun or the deepspeed launcher started them inside it), whose
    CPUs they would all take, where DeepSpeed's own split would have told them apart."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (plan is not None, task if plan is not None else None))
    planned = sum(has for has, _ in everyone)
    if 0 < planned < len(everyone):
        raise RuntimeError(f"zenflow_bind.deepspeed: {planned} ranks run under "
                           f"srun --zenflow-bind and {len(everyone) - planned} do not (this one "
                           f"{'does' if plan is not None else 'does not'}); ZenFlow's CPU split "
                           "needs every rank on the same path: run every node's tasks with "
                           "--zenflow-bind, or none")
    first = {}
    for rank, (_, owner) in enumerate(everyone):
        if owner is not None and first.setdefault(owner, rank) != rank:
            raise RuntimeError(
                f"zenflow_bind.deepspeed: ranks {first[owner]} and {rank} hold the plan of the "
                f"same srun task (job {owner[0]}, step {owner[1]}, task {owner[2]}), and would "
                "share its CPUs: torchrun or the deepspeed launcher started them inside one task. "
                "Start one task per rank (srun --ntasks-per-node=RANKS --zenflow-bind python "
                "train.py), or run the launcher without --zenflow-bind")


def _install(zu, plan, task):
    """Replace DeepSpeed's split by the plan's (plan None: DeepSpeed's own), after _agree."""
    current = zu._compute_zf_pt_affinity
    original = getattr(current, "_zenflow_bind_original", current)

    def compute_zf_pt_affinity(zf_optimizer):
        _agree(plan, task)
        if plan is None:
            return original(zf_optimizer)
        # (optimizer CPUs, training CPUs), as DeepSpeed's own function returns them; no
        # all_gather, no soft bind: the plugin already split the node among the tasks.
        return list(plan.opt_cpus), list(plan.train_cpus)

    compute_zf_pt_affinity._zenflow_bind_plan = plan
    compute_zf_pt_affinity._zenflow_bind_original = original
    zu._compute_zf_pt_affinity = compute_zf_pt_affinity


def use_plan(environ=None, config=None):
    """Make DeepSpeed's ZenFlow take its CPU split from srun --zenflow-bind. Returns the Plan,
    or None (with a warning saying why) when it does not: no plan in the environment, no
    DeepSpeed, a DeepSpeed whose ZenFlow internals differ from the ones this adapter knows, or
    (given config, the DeepSpeed config as a dict or JSON path) a configuration in which no
    ZenFlow optimizer process runs. Without config, deepspeed.initialize checks the config it
    is given the same way and warns. Call it on every rank before deepspeed.initialize: ranks
    with and without a plan then fail together, clearly, instead of hanging."""
    why, notes = _config_problems(config)
    if why:
        warnings.warn(f"zenflow_bind.deepspeed: {why}; nothing changed", stacklevel=2)
        return None
    try:
        plan = plan_from_environ(environ)
    except PlanUnavailable as e:
        plan, why = None, f"{e}; DeepSpeed keeps its own CPU split"
    zu, unknown = _zenflow_utils()
    if zu is None:
        warnings.warn(f"zenflow_bind.deepspeed: {why or unknown}; nothing changed",
                      stacklevel=2)
        return None
    # with no plan too: that rank still joins the agreement
    _install(zu, plan, _task_of(os.environ if environ is None else environ))
    if plan is None:
        warnings.warn(f"zenflow_bind.deepspeed: {why}", stacklevel=2)
        return None
    for note in notes:
        warnings.warn(f"zenflow_bind.deepspeed: {note}", stacklevel=2)
    if config is None:
        _watch_initialize(plan)
    try:
        import torch
    except ImportError:
        pass
    else:
        # OMP_NUM_THREADS was set before exec; a later change of the variable alone (as
        # DeepSpeed makes) no longer reaches torch's thread pool.
        torch.set_num_threads(plan.train_threads)
    return plan
