"""zenflow_bind.optim.AdamW under DistributedDataParallel, as most data-parallel trainers run it:
two gloo ranks, each with its own batches, with and without gradient_as_bucket_view, and with
buckets small enough that DDP averages several per backward. Each step must take DDP's averaged
gradients, though the worker's hook copies each gradient as soon as backward produces it, before
DDP has averaged it: training matches torch.optim.AdamW on the same model. With register_ddp()
the gradients are taken as DDP reduces them: once each (none copied again at step() unless edited
after backward), stepped during backward, through a user's hook, under no_sync(), with an
unused layer and with static_graph, always as torch's AdamW steps; and where DDP's writes to
.grad cannot be told from an edit (a stale unused layer, fused weights), left to step().
test_gpu.py runs the same on a CUDA model."""

import contextlib
import os
import tempfile
import unittest

import torch
import torch.distributed as dist

from torch_cases import batches, mlp

STEPS = 5


def parity(rank, world, store, device, view, out):
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    try:
        import zenflow_bind.optim as zt
        data = [(x.to(device), y.to(device)) for x, y in batches(STEPS, seed=11 + rank)]
        got = {}
        for name in ("ours", "torch"):
            model = torch.nn.parallel.DistributedDataParallel(
                mlp(0).to(device), gradient_as_bucket_view=view, bucket_cap_mb=0.001)
            if name == "ours":
                opt = zt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, threads=1)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
            for x, y in data:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            got[name] = [p.detach().cpu().clone() for p in model.parameters()]
            if name == "ours":
                opt.close()
        if rank == 0:
            torch.save(got, out)
    finally:
        dist.destroy_process_group()


class Net(torch.nn.Module):
    """mlp() with a layer used only when asked (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.body, self.spare = mlp(0), torch.nn.Linear(16, 4)
        self.use_spare = True

    def forward(self, x):
        y = self.body(x)
        return y + self.spare(x) if self.use_spare else y


def clone_hook(world, bucket):
    """A communication hook whose result is a new tensor, not the bucket (as compression hooks'
    can be): the average of a copy."""
    copy = bucket.buffer().div(world)
    return dist.all_reduce(copy, async_op=True).get_future().then(lambda f: f.value()[0])


def registered(rank, world, store, device, view, out):
    """Each case of register_ddp() against torch's AdamW on the same DDP model and batches;
    rank 0 saves {case: (ours, torch's, how many gradients step() found as DDP's hook left
    them, how many buckets stepped during backward)}."""
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    try:
        import zenflow_bind.optim as zt
        data = [(x.to(device), y.to(device)) for x, y in batches(STEPS, seed=11 + rank)]
        cases = {}
        for case in ("plain", "during", "clip", "no_sync", "hook", "unused", "unused_here",
                     "added", "in_process", "static"):
            got = []
            for name in ("ours", "torch"):
                net = Net().to(device)
                # (unused_here: the spare layer is used on rank 1 alone; rank 0 saves)
                net.use_spare = case != "unused" and (case != "unused_here" or rank == 1)
                model = torch.nn.parallel.DistributedDataParallel(
                    net, gradient_as_bucket_view=view, bucket_cap_mb=0.001,
                    find_unused_parameters=case.startswith("unused"),
                    static_graph=case == "static")
                if name == "ours":
                    first = net.body.parameters() if case == "added" else model.parameters()
                    opt = zt.AdamW(first, lr=1e-2, weight_decay=0.05, threads=1,
                                   bucket_elements=256, worker=case != "in_process")
                    opt.register_ddp(model, **({"hook": clone_hook, "state": world}
                                               if case == "hook" else {}))
                    if case == "added":  # a param group after register_ddp() is taken too
                        opt.add_param_group({"params": list(net.spare.parameters())})
                else:
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
                    if case == "hook":
                        model.register_comm_hook(world, clone_hook)
                kept, during = 0, 0
                for x, y in data:
                    # (set_to_none: torch 2's default, and 1.13's here, which kept .grad)
                    opt.zero_grad(**({"set_to_none": True} if case == "unused_here" else {}))
                    if case == "no_sync":
                        with model.no_sync():
                            torch.nn.functional.mse_loss(model(x * 0.5), y).backward()
                    block = opt.step_during_backward() if name == "ours" and \
                        case == "during" else contextlib.nullcontext()
                    with block:
                        torch.nn.functional.mse_loss(model(x), y).backward()
                    if case == "clip":
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                    if name == "ours" and opt.worker is not None:
                        slots = opt._ddp_slots.values()
                        kept += sum(s.unchanged_since_staged(opt._buffer) for s in slots)
                        during += len(opt._stream.stepped) if opt._stream else 0
                    opt.step()
                got.append([p.detach().cpu().clone() for p in model.parameters()])
                if name == "ours":
                    got.append((kept, during))
                    opt.close()
            cases[case] = got
        if rank == 0:
            torch.save(cases, out)
    finally:
        dist.destroy_process_group()


class Fused(torch.nn.Module):
    """Two weights concatenated in forward (a fused QKV): their gradients are views of one
    tensor, which share a version counter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Parameter(torch.randn(4, 16) * 0.1)
        self.k = torch.nn.Parameter(torch.randn(4, 16) * 0.1)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(x @ torch.cat([self.q, self.k]).t())


class Sparse(torch.nn.Module):
    """A sparse embedding (another optimizer's) beside dense layers (ours)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(32, 16, sparse=True)
        self.body = mlp(0)

    def forward(self, x):
        return self.body(x + self.emb(torch.arange(x.shape[0], device=x.device) % 32))


def awkward(rank, world, store, device, view, out):
    """register_ddp() where DDP's writes to .grad are not one per gradient: a layer unused on
    every rank that keeps a zeroed .grad (find_unused_parameters, zero_grad(set_to_none=False)),
    with an edit after backward and inside step_during_backward(); fused weights; a sparse
    embedding stepped by another optimizer; uneven inputs under join(); a step that copied the
    gradients again (clipped), then steps during backward; a layer used under no_sync() alone,
    then clipped (torch < 2.4's DDP does not count that use). Rank 0 saves {case:
    (ours, torch's)} or {case: the error ours raised}."""
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    try:
        import zenflow_bind.optim as zt
        cases = {}
        for case in ("stale_edit", "stale_during", "fused_during", "sparse", "join",
                     "join_active", "clipped_then_during", "stale_no_sync_clip"):
            got = []
            for name in ("ours", "torch"):
                net = {"fused_during": Fused, "sparse": Sparse}.get(case, Net)().to(device)
                model = torch.nn.parallel.DistributedDataParallel(
                    net, gradient_as_bucket_view=view, find_unused_parameters="stale" in case)
                dense = [p for n, p in model.named_parameters() if "emb" not in n]
                make = zt.AdamW if name == "ours" else torch.optim.AdamW
                opt = make(dense, lr=1e-2, weight_decay=0.05, **(
                    {"threads": 1, "bucket_elements": 256} if name == "ours" else {}))
                other = torch.optim.SparseAdam(list(net.emb.parameters()), lr=1e-2) \
                    if case == "sparse" else None
                if name == "ours":
                    opt.register_ddp(model)
                steps = batches(STEPS if rank == 0 or "join" not in case else 2, seed=11 + rank)
                joined = model.join(divide_by_initial_world_size=case == "join") \
                    if "join" in case else contextlib.nullcontext()
                try:
                    with joined:
                        for i, (x, y) in enumerate(steps):
                            if "stale" in case:
                                net.use_spare = i == 0  # unused after the first step
                            # (kept: a .grad step() copied again stays where it is)
                            opt.zero_grad(set_to_none=case in ("fused_during", "sparse", "join",
                                                               "join_active"))
                            during = name == "ours" and case.endswith("during") and \
                                (i or case != "clipped_then_during")
                            if case == "stale_no_sync_clip":  # used in no_sync() alone,
                                net.use_spare = True  # which torch < 2.4's DDP does not count
                                with model.no_sync():
                                    torch.nn.functional.mse_loss(model(x.to(device)),
                                                                 y.to(device)).backward()
                                net.use_spare = False
                            with opt.step_during_backward() if during else \
                                    contextlib.nullcontext():
                                loss = torch.nn.functional.mse_loss(model(x.to(device)),
                                                                    y.to(device))
                                loss.backward()
                            if case == "stale_edit" and i == 1:  # (the first unused)
                                with torch.no_grad():
                                    for p in dense:
                                        p.grad.add_(0.5)  # one write after backward
                            if case == "clipped_then_during" and i == 0 or \
                                    case == "stale_no_sync_clip":  # step() copies them again
                                torch.nn.utils.clip_grad_norm_(dense, 0.05)
                            if during:  # (the later steps still take them from DDP's hook)
                                streamed = (len(opt._stream.stepped) if opt._stream else 0,
                                            sum(len(lay.buckets) for lay in opt._layouts))
                            opt.step()
                            if other is not None:
                                other.step()
                                other.zero_grad()
                except RuntimeError as e:
                    if name != "ours":
                        raise
                    got = str(e)
                    opt.close()
                    break
                got.append([p.detach().cpu().clone() for p in dense])
                if name == "ours":
                    opt.close()
                    if case.endswith("during"):
                        got.append(streamed)  # buckets stepped during the last backward, of
            cases[case] = got
        if rank == 0:
            torch.save(cases, out)
    finally:
        dist.destroy_process_group()


def on_two_ranks(fn, device, view):
    """fn(rank, world, store, device, view, out) on two gloo ranks: what rank 0 saved in out."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as where:
        out = os.path.join(where, "out.pt")
        mp.spawn(fn, args=(2, os.path.join(where, "store"), device, view, out), nprocs=2)
        return torch.load(out)


def run_awkward(test, device):
    for view in (False, True):
        cases = on_two_ranks(awkward, device, view)
        for case, got in cases.items():
            with test.subTest(gradient_as_bucket_view=view, case=case):
                if case == "join_active":  # DDP divides by the ranks left: no hook can
                    test.assertIn("divide_by_initial_world_size=True", got)
                    continue
                test.assertIsInstance(got, list, got)
                if case.endswith("during"):
                    ours, streamed, theirs = got
                    # (without bucket views DDP may or may not write the stale layer's .grad,
                    # and the fused weights' share a version counter: those buckets wait for
                    # step())
                    went, buckets = streamed
                    test.assertEqual(went == buckets, view or case == "clipped_then_during")
                else:
                    ours, theirs = got
                for a, b in zip(ours, theirs):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def run_registered(test, device):
    for view in (False, True):
        cases = on_two_ranks(registered, device, view)
        grads = 8 * STEPS  # 4 Linear layers, a weight and a bias each
        for case, (ours, (kept, during), theirs) in cases.items():
            with test.subTest(gradient_as_bucket_view=view, case=case):
                for a, b in zip(ours, theirs):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                # every gradient DDP reduced was taken once, as it stands after backward
                # (clip_grad_norm_ rewrote them all: taken again; the spare layer, unused, has
                # none: with find_unused_parameters and no bucket views, those used here are
                # taken, as DDP copies into them for certain; the spare layer used on the other
                # rank alone has no .grad here when its bucket is reduced: left to step())
                unused = grads - 2 * STEPS
                want = {"clip": 0, "unused": unused, "unused_here": unused,
                        "in_process": 0}.get(case, grads)
                test.assertEqual(kept, want)
                test.assertEqual(during > 0, case == "during")


def run_parity(test, device):
    for view in (False, True):
        with test.subTest(gradient_as_bucket_view=view):
            got = on_two_ranks(parity, device, view)
            for a, b in zip(got["ours"], got["torch"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "no gloo")
class RegisterRefusals(unittest.TestCase):
    """register_ddp()'s refusals, before anything changes (one gloo rank in this process)."""

    @classmethod
    def setUpClass(cls):
        cls.where = tempfile.TemporaryDirectory()
        dist.init_process_group("gloo", store=dist.FileStore(cls.where.name + "/s", 1),
                                rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        cls.where.cleanup()

    def test_refusals(self):
        import zenflow_bind.optim as zt
        for worker in (True, False):
            model = torch.nn.parallel.DistributedDataParallel(mlp(0))
            other = torch.nn.parallel.DistributedDataParallel(mlp(1))
            with self.subTest(worker=worker), \
                    zt.AdamW(model.parameters(), threads=1, worker=worker) as opt:
                with self.assertRaisesRegex(TypeError, "DistributedDataParallel.*not a Seq"):
                    opt.register_ddp(model.module)
                with self.assertRaisesRegex(ValueError, "state of the hook"):
                    opt.register_ddp(model, state=dist.group.WORLD)
                with self.assertRaisesRegex(TypeError, "communication hook.*not a int"):
                    opt.register_ddp(model, hook=3)
                if worker:
                    with self.assertRaisesRegex(ValueError, "none of the DDP model's"):
                        opt.register_ddp(other)
                    opt.register_ddp(model)
                    with self.assertRaisesRegex(RuntimeError, "called already"):
                        opt.register_ddp(model)
                    # the first registration stands: one backward and step go through it
                    self.assertEqual(taken_once(model, opt), 6)

    def test_a_new_optimizer_takes_the_hook_over(self):
        # DDP takes one communication hook per model, for good: an optimizer made to resume
        # (its worker died, say) takes the hook of the one before over, once that one is closed
        import zenflow_bind.optim as zt
        model = torch.nn.parallel.DistributedDataParallel(mlp(0))
        first = zt.AdamW(model.parameters(), threads=1)
        first.register_ddp(model)
        self.assertEqual(taken_once(model, first), 6)
        first.close()
        with zt.AdamW(model.parameters(), threads=1) as again:
            again.register_ddp(model)
            self.assertEqual(taken_once(model, again), 6)
        params = list(model.parameters())
        with zt.AdamW(params[1:], threads=1) as split, zt.AdamW(params[:1], threads=1) as other:
            split.register_ddp(model)
            self.assertEqual(taken_once(model, split), 5)  # the other's weight keeps its hook
            with self.assertRaisesRegex(RuntimeError, "another zenflow_bind.optim.AdamW, "
                                                      "still open"):
                other.register_ddp(model)
            split.close()
            other.register_ddp(model)
            self.assertEqual(taken_once(model, other), 1)

    def test_a_new_ddp_once_the_registered_one_is_gone(self):
        # the Hugging Face Trainer's auto_find_batch_size drops its DDP after an out-of-memory
        # error and wraps the module anew: the optimizer takes the new one's gradients (with
        # find_unused_parameters, the Trainer's default, through uses noted for the new one)
        import gc
        import zenflow_bind.optim as zt
        net = mlp(0)
        for unused in (False, True):
            with self.subTest(find_unused_parameters=unused), \
                    zt.AdamW(net.parameters(), threads=1) as opt:
                first = torch.nn.parallel.DistributedDataParallel(
                    net, find_unused_parameters=unused)
                opt.register_ddp(first)
                self.assertEqual(taken_once(first, opt), 6)
                second = torch.nn.parallel.DistributedDataParallel(
                    net, find_unused_parameters=unused)
                with self.assertRaisesRegex(RuntimeError, "called already"):
                    opt.register_ddp(second)  # the first still lives
                del first
                gc.collect()
                opt.register_ddp(second)
                self.assertEqual(taken_once(second, opt), 6)
                # a third around the last layer alone: the others' gradients go back to being
                # their slices of the buffer (copied once, then accumulated there)
                del second
                gc.collect()
                opt.register_ddp(torch.nn.parallel.DistributedDataParallel(net[4]))
                for _ in range(2):
                    net(torch.ones(2, 16)).sum().backward()
                    opt.step()
                slots = [s for layout in opt._layouts for s in layout.slots]
                self.assertEqual([s.grads[opt._buffer].data_ptr() == s.param.grad.data_ptr()
                                  for s in slots], [True] * 4 + [False] * 2)
                opt.zero_grad()


    def test_parameters_ddp_is_told_to_leave_alone_keep_the_hook(self):
        # named as DDP's reducer names them: ".top" for a parameter of the wrapped module
        # itself (which "top" does not name there), "sub.weight" below it
        import zenflow_bind.optim as zt

        class Top(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.top = torch.nn.Parameter(torch.ones(16))
                self.sub = mlp(0)

            def forward(self, x):
                return self.sub(x * self.top)

        for ignored, want in ((["top"], {"top", "sub.0.weight"}), (["sub.0.weight"], {"top"}),
                              ([".top"], {"sub.0.weight"})):
            net = Top()
            net._ddp_params_and_buffers_to_ignore = ignored
            model = torch.nn.parallel.DistributedDataParallel(net)
            with zt.AdamW(model.parameters(), threads=1) as opt:
                opt.register_ddp(model)
                taken = {n for n, p in net.named_parameters() if id(p) in opt._ddp_slots}
                self.assertEqual(taken & {"top", "sub.0.weight"}, want, ignored)
                self.assertEqual(len(taken), 7 - (len(want) < 2))


def taken_once(model, opt):
    """One backward and step() of a one-rank DDP model: how many of opt's gradients step()
    found as DDP's hook left them."""
    torch.nn.functional.mse_loss(model(torch.ones(2, 16)), torch.zeros(2, 4)).backward()
    kept = sum(s.unchanged_since_staged(opt._buffer) for s in opt._ddp_slots.values())
    opt.step()
    opt.zero_grad()
    return kept


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "no gloo")
class DataParallel(unittest.TestCase):
    def test_training_matches_torch_adamw(self):
        run_parity(self, "cpu")

    def test_register_ddp_takes_each_reduced_gradient_once(self):
        run_registered(self, "cpu")

    def test_register_ddp_where_ddp_writes_grads_otherwise(self):
        run_awkward(self, "cpu")


if __name__ == "__main__":
    unittest.main()
