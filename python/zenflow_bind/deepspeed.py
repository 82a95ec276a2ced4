"""Make DeepSpeed use the CPUs that srun --zenflow-bind planned.

DeepSpeed's ZenFlow splits the CPUs of its optimizer process and of PyTorch itself out of the
process's *current affinity* (zenflow_utils._compute_zf_pt_affinity: an all_gather of every
rank's affinity, a "soft bind" by global rank, then pt_reserved_cores_perc). Under
srun --zenflow-bind the task's affinity is already only its training CPUs, so ZenFlow would split
those again and leave ZENFLOW_OPT_CPUS idle. One call before deepspeed.initialize fixes that:

    import zenflow_bind.deepspeed
    zenflow_bind.deepspeed.use_plan()          # then deepspeed.initialize(...) as usual

ZenFlow's optimizer process then runs on ZENFLOW_OPT_CPUS (one thread per CPU listed, which is
ZENFLOW_OPT_THREADS) and PyTorch on ZENFLOW_TRAIN_CPUS with torch.set_num_threads to match. The
decision depends only on the environment and on DeepSpeed's code, so every rank of a step makes
the same one, and no collective is left for some ranks and not others.

DeepSpeed ZeRO-Offload without ZenFlow (DeepSpeedCPUAdam inside the training process) needs no
call: run it under srun --zenflow-bind=mode=offload, which gives each task its whole share and
OMP_NUM_THREADS to match.
"""

import inspect
import os
import warnings

__all__ = ["Plan", "PlanUnavailable", "plan_from_environ", "use_plan"]


class PlanUnavailable(Exception):
    """The environment holds no usable zenflow-bind plan; the message says why."""


class Plan:
    """The CPUs srun --zenflow-bind gave this task."""

    def __init__(self, train_cpus, opt_cpus, opt_threads):
        self.train_cpus = train_cpus
        self.opt_cpus = opt_cpus
        self.opt_threads = opt_threads

    @property
    def train_threads(self):
        return len(self.train_cpus)

    def __repr__(self):
        return (f"Plan(train_cpus={self.train_cpus}, opt_cpus={self.opt_cpus}, "
                f"opt_threads={self.opt_threads})")


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
    plan = Plan(_cpulist("ZENFLOW_TRAIN_CPUS", train), opt_cpus, len(opt_cpus))
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
    if getattr(compute, "_zenflow_bind_plan", None) is not None:
        return zu, None  # already ours (use_plan called twice)
    if list(inspect.signature(compute).parameters) != ["zf_optimizer"]:
        return None, (f"_compute_zf_pt_affinity{inspect.signature(compute)} is not "
                      "(zf_optimizer)")
    code = getattr(start, "__code__", None)
    if code is None or "_compute_zf_pt_affinity" not in code.co_names:
        return None, "start_optimizer_process does not call _compute_zf_pt_affinity"
    return zu, None


def use_plan(environ=None):
    """Make DeepSpeed's ZenFlow take its CPU split from srun --zenflow-bind. Returns the Plan,
    or None (with a warning saying why) when nothing was changed: no plan in the environment, no
    DeepSpeed, or a DeepSpeed whose ZenFlow internals differ from the ones this adapter knows.
    Call it on every rank before deepspeed.initialize."""
    try:
        plan = plan_from_environ(environ)
    except PlanUnavailable as e:
        warnings.warn(f"zenflow_bind.deepspeed: {e}; DeepSpeed keeps its own CPU split",
                      stacklevel=2)
        return None
    zu, why = _zenflow_utils()
    if zu is None:
        warnings.warn(f"zenflow_bind.deepspeed: {why}; nothing changed", stacklevel=2)
        return None

    def compute_from_plan(zf_optimizer):
        # (optimizer CPUs, training CPUs), as DeepSpeed's own function returns them; no
        # all_gather, no soft bind: the plugin already split the node among the tasks.
        return list(plan.opt_cpus), list(plan.train_cpus)

    compute_from_plan._zenflow_bind_plan = plan
    zu._compute_zf_pt_affinity = compute_from_plan
    try:
        import torch
    except ImportError:
        pass
    else:
        # OMP_NUM_THREADS was set before exec; a later change of the variable alone (as
        # DeepSpeed makes) no longer reaches torch's thread pool.
        torch.set_num_threads(plan.train_threads)
    return plan
