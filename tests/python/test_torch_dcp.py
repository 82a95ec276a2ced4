"""zenflow_bind.optim.AdamW where torch 2.x reads and fills optimizer state: optimizer.state as
torch.optim.AdamW holds it, writes into it, the Optimizer hooks, param_names, and
torch.distributed.checkpoint (get/set_optimizer_state_dict, dcp.save/load), which must never step
it. A test whose torch API this torch lacks says so and skips; CI runs this file on torch 1.13,
2.6 and 2.14."""

import copy
import inspect
import tempfile
import unittest
import warnings

import torch

from torch_cases import assert_close, assert_equal, batches, groups_of, mlp, ours, train

try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
except (ImportError, ValueError):  # ValueError: torch 1.13's _shard under Python 3.11
    dcp = None

# DCP's options: its default, and the flattened optimizer state torchtitan saves and loads, which
# looks up every key of the optimizer's live param groups in the checkpoint
OPTIONS = [None]
if dcp is not None and "flatten_optimizer_state_dict" in StateDictOptions.__dataclass_fields__:
    OPTIONS.append(StateDictOptions(flatten_optimizer_state_dict=True))

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def need(condition, what):
    if not condition:
        raise unittest.SkipTest(f"torch {torch.__version__} has no {what}")


class OptimizerState(unittest.TestCase):
    def test_holds_what_torch_adamw_holds(self):
        a, b, data = mlp(), mlp(), batches(4)
        with ours(groups_of(a), lr=1e-2) as opt:
            ref = torch.optim.AdamW(groups_of(b), lr=1e-2)
            self.assertFalse(opt.state)  # as torch: nothing before the first step
            train(a, opt, data)
            train(b, ref, data)
            self.assertEqual(len(opt.state), len(ref.state))
            for p, q in zip(a.parameters(), b.parameters()):
                ours_state, torch_state = opt.state[p], ref.state[q]
                self.assertEqual(sorted(ours_state), sorted(torch_state))
                self.assertEqual(float(ours_state["step"]), float(torch_state["step"]))
                for key in ("exp_avg", "exp_avg_sq"):
                    self.assertEqual(ours_state[key].shape, p.shape)
                    torch.testing.assert_close(ours_state[key], torch_state[key], rtol=1e-5,
                                               atol=1e-7)

    def test_writes_reach_the_worker(self):
        def in_place(state):
            state["exp_avg"].mul_(0.5)

        def assigned(state):
            state["exp_avg_sq"] = state["exp_avg_sq"] * 3

        # each alone: a write in place elsewhere in the group must not be what reveals an
        # assignment
        for name, edit in (("in place", in_place), ("assigned", assigned)):
            with self.subTest(name):
                a, b, data = mlp(), mlp(), batches(8)
                with ours(a.parameters(), lr=1e-2) as opt:
                    ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
                    train(a, opt, data[:4])
                    train(b, ref, data[:4])
                    for o, model in ((opt, a), (ref, b)):
                        edit(o.state[list(model.parameters())[2]])
                    opt.state_dict()  # reads the state too, and sends the edit
                    train(a, opt, data[4:])
                    train(b, ref, data[4:])
                    assert_close(self, a.parameters(), b.parameters())

    def test_state_dicts_between_steps_share_their_entries(self):
        # as torch's: the same tensors each time (not brought out of the worker again), and an
        # edit through one of them is seen by the next and reaches the worker
        a, b, data = mlp(), mlp(), batches(6)
        with ours(a.parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
            train(a, opt, data[:3])
            train(b, ref, data[:3])
            for o in (opt, ref):
                first, second = o.state_dict()["state"], o.state_dict()["state"]
                for i, entry in first.items():
                    for key, value in entry.items():
                        self.assertIs(second[i][key], value, f"{type(o).__name__} {i} {key}")
                second[1]["exp_avg"].mul_(0.5)
                self.assertEqual(float(o.state_dict()["state"][1]["exp_avg"].sum()),
                                 float(second[1]["exp_avg"].sum()))
            train(a, opt, data[3:])
            train(b, ref, data[3:])
            assert_close(self, a.parameters(), b.parameters())

    def test_a_write_the_worker_cannot_take_is_not_dropped(self):
        a, data = mlp(), batches(3)
        with ours(a.parameters(), lr=1e-2) as opt:
            train(a, opt, data[:1])
            saved = copy.deepcopy(opt.state_dict())  # as torch's, it shares opt.state's entries
            p = next(a.parameters())
            # of another size, or of as many elements transposed (it would step scrambled)
            for wrong in (torch.zeros(3), torch.zeros(p.shape[::-1])):
                opt.state[p]["exp_avg"] = wrong
                for _ in range(2):  # refused each time, not dropped after the first
                    with self.assertRaisesRegex(ValueError, rf"exp_avg has shape "
                                                            rf"\({wrong.shape[0]},"):
                        train(a, opt, data[1:2])
            opt.load_state_dict(saved)  # a load replaces it
            train(a, opt, data[2:])
            self.assertEqual(float(opt.state[p]["step"]), 2.0)

    def test_reading_it_changes_nothing(self):
        a, b, data = mlp(), mlp(), batches(6)
        with ours(a.parameters(), lr=1e-2) as opt_a, ours(b.parameters(), lr=1e-2) as opt_b:
            for x, y in data:
                for model, opt in ((a, opt_a), (b, opt_b)):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                sum(float(s["exp_avg"].sum()) for s in opt_a.state.values())
            assert_equal(self, a.parameters(), b.parameters())

    def test_assigning_the_whole_state_is_refused(self):
        a = mlp()
        with ours(a.parameters()) as opt:
            with self.assertRaisesRegex(TypeError, "load_state_dict"):
                opt.state = {next(a.parameters()): {"step": torch.tensor(1.0)}}

    def test_adam_with_l2_and_no_bias_correction_survive_a_round_trip(self):
        a = mlp()
        with ours(a.parameters(), adamw_mode=False, bias_correction=False) as opt:
            train(a, opt, batches(1))
            sd = opt.state_dict()
            with ours(mlp().parameters()) as other:
                other.load_state_dict(sd)
                # the live groups hold the keys their state dicts save (DCP looks them up)
                self.assertEqual(other.param_groups[0].keys() - {"params"},
                                 sd["param_groups"][0].keys() - {"params"})
                self.assertEqual(other.state_dict()["param_groups"], sd["param_groups"])
        torch_keys = torch.optim.AdamW(mlp().parameters()).param_groups[0].keys()
        if "decoupled_weight_decay" in torch_keys:
            self.assertIs(sd["param_groups"][0]["decoupled_weight_decay"], False)
            self.assertNotIn("adamw_mode", sd["param_groups"][0])
        else:
            self.assertIs(sd["param_groups"][0]["adamw_mode"], False)
        self.assertIs(sd["param_groups"][0]["bias_correction"], False)
        with ours(mlp().parameters()) as plain:  # torch's math: in torch's keys alone
            keys = plain.param_groups[0].keys()
            self.assertFalse(keys & {"adamw_mode", "bias_correction"})
            self.assertEqual("decoupled_weight_decay" in keys,
                             "decoupled_weight_decay" in torch_keys)


class Hooks(unittest.TestCase):
    def test_step_hooks(self):
        need(hasattr(torch.optim.Optimizer, "register_step_pre_hook"), "step hooks")
        a, calls = mlp(), []
        with ours(a.parameters()) as opt:
            opt.register_step_pre_hook(lambda o, args, kw: calls.append(("pre", o)))
            opt.register_step_post_hook(lambda o, args, kw: calls.append(("post", o)))
            train(a, opt, batches(2))
            self.assertEqual(calls, [("pre", opt), ("post", opt)] * 2)

    def test_state_dict_hooks(self):
        need(hasattr(torch.optim.Optimizer, "register_state_dict_pre_hook"), "state-dict hooks")
        for worker in (True, False):
            with self.subTest(worker=worker):
                self.state_dict_hooks(worker)

    def state_dict_hooks(self, worker):
        a, calls = mlp(), []
        with ours(a.parameters(), worker=worker) as opt:
            train(a, opt, batches(2))
            opt.register_state_dict_pre_hook(lambda o: calls.append("pre"))

            def tag(o, sd):
                calls.append("post")
                sd["tagged"] = True
                return sd
            opt.register_state_dict_post_hook(tag)
            sd = opt.state_dict()
            self.assertTrue(sd["tagged"])

            def lower_lr(o, sd):  # a new dict, as torch's hooks may return
                calls.append("load pre")
                sd = copy.deepcopy(sd)
                sd["param_groups"][0]["lr"] = 0.125
                return sd

            def loaded(o):  # after the whole load: the new lr and fp32 moments in place
                calls.append("load post")
                self.assertEqual(o.param_groups[0]["lr"], 0.125)
                self.assertTrue(all(s["exp_avg"].dtype == torch.float32
                                    for s in o.state.values()))
            def other_groups(o, sd):  # changes the shallow copy it is given, as torch's may
                sd["param_groups"] = [dict(g, eps=1e-6) for g in sd["param_groups"]]
            opt.register_load_state_dict_pre_hook(other_groups)
            opt.register_load_state_dict_pre_hook(lower_lr)
            opt.register_load_state_dict_post_hook(loaded)
            opt.load_state_dict(sd)
            self.assertEqual((opt.param_groups[0]["lr"], opt.param_groups[0]["eps"]),
                             (0.125, 1e-6))
            self.assertEqual((sd["param_groups"][0]["lr"], sd["param_groups"][0]["eps"]),
                             (1e-3, 1e-8))  # the caller's dict untouched
            self.assertEqual(calls, ["pre", "post", "load pre", "load post"])

    def test_a_state_dict_in_the_middle_of_a_load_is_refused(self):
        # what a signal handler's checkpoint would call: the hooks' exemption is theirs alone
        for worker in (True, False):
            with self.subTest(worker=worker):
                a = mlp()
                with ours(a.parameters(), worker=worker) as opt:
                    train(a, opt, batches(2))
                    sd = copy.deepcopy(opt.state_dict())
                    inner = "_apply_group_state" if worker else "_check_saved"
                    call, seen = getattr(opt, inner), []

                    def midway(*args):
                        reads = [opt.state_dict] + ([lambda: opt.state] if worker else [])
                        for read in reads:  # (worker=False's state is torch's own dict)
                            try:
                                read()
                            except RuntimeError as e:
                                seen.append(str(e))
                        return call(*args)
                    setattr(opt, inner, midway)
                    opt.load_state_dict(sd)
                    self.assertTrue(len(seen) >= 1 + worker and
                                    all("load_state_dict" in s for s in seen), seen)

    def test_load_hooks_may_read_the_state_dict(self):
        # torch's allow it: a pre-hook filling what a partial checkpoint lacks from the current
        # state, a post-hook looking at what was loaded
        need(hasattr(torch.optim.Optimizer, "register_load_state_dict_pre_hook"), "load hooks")
        for worker in (True, False):
            with self.subTest(worker=worker):
                a = mlp()
                with ours(a.parameters(), worker=worker) as opt:
                    train(a, opt, batches(2))
                    full = opt.state_dict()
                    current = {k: {n: t.clone() for n, t in e.items()}
                               for k, e in full["state"].items()}

                    def fill_missing(o, sd):
                        sd["state"] = {**o.state_dict()["state"], **sd["state"]}
                        return sd
                    seen = []
                    opt.register_load_state_dict_pre_hook(fill_missing)
                    opt.register_load_state_dict_post_hook(
                        lambda o: seen.append(sorted(o.state_dict()["state"])))
                    partial = copy.deepcopy(full)
                    del partial["state"][0]
                    partial["state"][1]["exp_avg"].fill_(0.5)
                    opt.load_state_dict(partial)
                    self.assertEqual(seen, [sorted(current)])
                    after = opt.state_dict()["state"]
                    self.assertTrue(torch.equal(after[0]["exp_avg"], current[0]["exp_avg"]))
                    self.assertTrue(torch.all(after[1]["exp_avg"] == 0.5))

    def test_param_names(self):
        probe = mlp()
        try:
            torch.optim.AdamW(probe.named_parameters())
        except (TypeError, ValueError, AttributeError):
            need(False, "named parameters in optimizers")
        a, b, data = mlp(), mlp(), batches(3)
        with ours(a.named_parameters(), lr=1e-2) as opt:
            ref = torch.optim.AdamW(b.named_parameters(), lr=1e-2)
            train(a, opt, data)
            train(b, ref, data)
            ours_sd, torch_sd = opt.state_dict(), ref.state_dict()
            self.assertEqual(ours_sd["param_groups"][0]["param_names"],
                             torch_sd["param_groups"][0]["param_names"])
            self.assertEqual(sorted(ours_sd["state"]), sorted(torch_sd["state"]))


class DistributedCheckpoint(unittest.TestCase):
    def setUp(self):
        need(dcp is not None, "torch.distributed.checkpoint.state_dict")

    def test_get_optimizer_state_dict_never_steps(self):
        a, b, c, data = mlp(), mlp(), mlp(), batches(6)
        with ours(groups_of(a), lr=1e-2) as opt, ours(groups_of(c), lr=1e-2) as untouched:
            ref = torch.optim.AdamW(groups_of(b), lr=1e-2)
            for model, o in ((a, opt), (b, ref), (c, untouched)):
                train(model, o, data[:3])
                o.zero_grad(set_to_none=True)  # else DCP finds gradients and steps nothing
            osd = get_optimizer_state_dict(a, opt)
            self.assertEqual(float(osd["state"]["0.weight"]["step"]), 3.0)
            get_optimizer_state_dict(b, ref)
            for model, o in ((a, opt), (b, ref), (c, untouched)):
                train(model, o, data[3:])
            assert_equal(self, a.parameters(), c.parameters())
            assert_close(self, a.parameters(), b.parameters())

    def test_save_and_load_resume_bit_identical(self):
        # bf16 too: the fp32 master comes back from the checkpoint with its extra bits
        for dtype, options in ((d, o) for d in (torch.float32, torch.bfloat16) for o in OPTIONS):
            data = [(x.to(dtype), y.to(dtype)) for x, y in batches(10)]
            straight, first = mlp(dtype=dtype), mlp(dtype=dtype)
            with ours(groups_of(straight), lr=1e-2) as opt:
                train(straight, opt, data)
            with tempfile.TemporaryDirectory() as where:
                with ours(groups_of(first), lr=1e-2) as opt:
                    train(first, opt, data[:5])
                    dcp.save({"model": get_model_state_dict(first),
                              "optim": get_optimizer_state_dict(first, opt, options=options)},
                             checkpoint_id=where)
                resumed = mlp(seed=9, dtype=dtype)  # everything must come from the checkpoint
                with ours(groups_of(resumed), lr=0.5) as opt:
                    sd = {"model": get_model_state_dict(resumed),
                          "optim": get_optimizer_state_dict(resumed, opt, options=options)}
                    dcp.load(sd, checkpoint_id=where)
                    set_model_state_dict(resumed, sd["model"])
                    set_optimizer_state_dict(resumed, opt, sd["optim"], options=options)
                    self.assertEqual(opt.param_groups[0]["lr"], 1e-2)
                    self.assertEqual(float(opt.state[resumed[0].weight]["step"]), 5.0)
                    train(resumed, opt, data[5:])
            assert_equal(self, resumed.parameters(), straight.parameters())

    def test_an_async_save_while_training_goes_on(self):
        # dcp.async_save (as torchtitan saves) returns once it has staged the state dict, and
        # writes it from another thread while the next steps run: the checkpoint holds the
        # step it was taken at, and resumes to the bit (bf16: the masters come from the worker)
        # Before its async_stager argument (torch 2.6), async_save staged CPU tensors without
        # copying them: a step while it writes changed them under it, torch's own AdamW's too.
        need(dcp is not None and "async_stager" in inspect.signature(dcp.async_save).parameters,
             "dcp.async_save that copies what it writes before it returns")
        import torch.distributed as dist
        for dtype in (torch.float32, torch.bfloat16):
            data = [(x.to(dtype), y.to(dtype)) for x, y in batches(8)]
            straight, first = mlp(dtype=dtype), mlp(dtype=dtype)
            with ours(straight.parameters(), lr=1e-2) as opt:
                train(straight, opt, data)
            with tempfile.TemporaryDirectory() as where:
                if not dist.is_initialized():  # async_save's thread wants a process group
                    dist.init_process_group("gloo", store=dist.FileStore(where + "/s", 1),
                                            rank=0, world_size=1)
                try:
                    with ours(first.parameters(), lr=1e-2) as opt:
                        train(first, opt, data[:4])
                        saving = dcp.async_save(
                            {"model": get_model_state_dict(first),
                             "optim": get_optimizer_state_dict(first, opt)},
                            checkpoint_id=where + "/ckpt")
                        train(first, opt, data[4:6])  # while it writes
                        saving.result()
                    resumed = mlp(seed=9, dtype=dtype)
                    with ours(resumed.parameters(), lr=0.5) as opt:
                        sd = {"model": get_model_state_dict(resumed),
                              "optim": get_optimizer_state_dict(resumed, opt)}
                        dcp.load(sd, checkpoint_id=where + "/ckpt")
                        set_model_state_dict(resumed, sd["model"])
                        set_optimizer_state_dict(resumed, opt, sd["optim"])
                        train(resumed, opt, data[4:])
                finally:
                    dist.destroy_process_group()
            assert_equal(self, resumed.parameters(), straight.parameters())

    def test_a_group_made_adam_later_resumes_flattened(self):
        # adamw_mode set on a live group: state_dict() saves it in torch's key, and the group
        # holds that key from then on, which a flattened load into it looks up
        need(len(OPTIONS) > 1, "flatten_optimizer_state_dict")
        data = batches(6)
        for worker in (True, False):
            with self.subTest(worker=worker), tempfile.TemporaryDirectory() as where:
                a, straight = mlp(), mlp()
                with ours(a.parameters(), lr=1e-2, worker=worker) as opt, \
                        ours(straight.parameters(), lr=1e-2, adamw_mode=False,
                             worker=worker) as ref:
                    opt.param_groups[0]["adamw_mode"] = False
                    train(a, opt, data[:3])
                    train(straight, ref, data)
                    dcp.save({"optim": get_optimizer_state_dict(a, opt, options=OPTIONS[1])},
                             checkpoint_id=where)
                    sd = {"optim": get_optimizer_state_dict(a, opt, options=OPTIONS[1])}
                    dcp.load(sd, checkpoint_id=where)
                    set_optimizer_state_dict(a, opt, sd["optim"], options=OPTIONS[1])
                    train(a, opt, data[3:])
                assert_equal(self, a.parameters(), straight.parameters())

    def test_checkpoints_move_to_and_from_torch_adamw(self):
        # DCP loads the keys the optimizer's own state dict has, strictly: both kinds must have
        # torch.optim.AdamW's, in both modes
        def make(kind, model):
            if kind == "torch":
                return torch.optim.AdamW(groups_of(model), lr=1e-2, foreach=False)
            return ours(groups_of(model), lr=1e-2, worker=kind == "worker")

        data = batches(6)
        for src, dst, options in ((s, d, o) for s, d in (
                ("torch", "worker"), ("torch", "in process"), ("worker", "torch"),
                ("in process", "torch")) for o in OPTIONS):
            with self.subTest(f"{src} to {dst}, {options}"), \
                    tempfile.TemporaryDirectory() as where:
                a, b, c = mlp(), mlp(), mlp(seed=9)
                opt_a, opt_b = make(src, a), make(dst, b)
                train(a, opt_a, data[:3])
                train(b, opt_b, data[:3])
                self.assertEqual(set(opt_a.state_dict()["param_groups"][0]),
                                 set(opt_b.state_dict()["param_groups"][0]))
                dcp.save({"model": get_model_state_dict(a),
                          "optim": get_optimizer_state_dict(a, opt_a, options=options)},
                         checkpoint_id=where)
                opt_c = make(dst, c)
                sd = {"model": get_model_state_dict(c),
                      "optim": get_optimizer_state_dict(c, opt_c, options=options)}
                dcp.load(sd, checkpoint_id=where)
                set_model_state_dict(c, sd["model"])
                set_optimizer_state_dict(c, opt_c, sd["optim"], options=options)
                train(b, opt_b, data[3:])
                train(c, opt_c, data[3:])
                assert_close(self, c.parameters(), b.parameters())
                for o in (opt_a, opt_b, opt_c):
                    getattr(o, "close", lambda: None)()

    def test_a_torch_checkpoint_of_a_bf16_model_loads_partially(self):
        # torch's AdamW keeps no fp32 master; ours saves one, so DCP's template asks for a
        # master_param the checkpoint lacks: a partial load (zenflow_bind.optim(3)) leaves it
        # to the model, as load_state_dict of torch's state dict does
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        bf16 = torch.bfloat16
        data = [(x.to(bf16), y.to(bf16)) for x, y in batches(6)]
        for worker in (True, False):
            with self.subTest(worker=worker), tempfile.TemporaryDirectory() as where:
                a = mlp(dtype=bf16)
                ref = torch.optim.AdamW(a.parameters(), lr=1e-2, foreach=False)
                train(a, ref, data[:3])
                dcp.save({"model": get_model_state_dict(a),
                          "optim": get_optimizer_state_dict(a, ref)}, checkpoint_id=where)
                b, c = mlp(seed=5, dtype=bf16), mlp(seed=9, dtype=bf16)
                b.load_state_dict(a.state_dict())
                with ours(b.parameters(), lr=1e-2, worker=worker) as opt_b, \
                        ours(c.parameters(), lr=1e-2, worker=worker) as opt_c:
                    opt_b.load_state_dict(copy.deepcopy(ref.state_dict()))
                    sd = {"model": get_model_state_dict(c),
                          "optim": get_optimizer_state_dict(c, opt_c)}
                    # (DCP's CheckpointException is a BaseException)
                    with self.assertRaisesRegex(BaseException, "master_param"):
                        dcp.load(copy.deepcopy(sd), checkpoint_id=where)
                    dcp.load(sd, checkpoint_id=where,
                             planner=DefaultLoadPlanner(allow_partial_load=True))
                    set_model_state_dict(c, sd["model"])
                    set_optimizer_state_dict(c, opt_c, sd["optim"])
                    train(b, opt_b, data[3:])
                    train(c, opt_c, data[3:])
                    assert_equal(self, c.parameters(), b.parameters())


if __name__ == "__main__":
    unittest.main()
