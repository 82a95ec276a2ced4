"""zenflow_bind.optim.AdamW in Hugging Face transformers' Trainer, as a user passes it:
Trainer(..., optimizers=(AdamW(...), scheduler)) on a GPT-2 built from a config (no download),
text from this source tree with a byte-level vocabulary. It trains (the loss falls), saves a
checkpoint, and a new Trainer with a new optimizer resumed from it ends where an uninterrupted run
does; on the GPU where the machine has one. Under DDP (two gloo ranks, as torchrun starts them)
the Synchronize callback has the optimizer take each gradient from DDP's reduction, and training
ends where torch's AdamW under the same Trainer does. Skips where transformers is not installed
(Debian forky's python3-transformers has it; CI runs this file there)."""

import os
import socket
import tempfile
import unittest
import warnings

import torch

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
except ImportError:
    transformers = None

import zenflow_bind.optim

warnings.filterwarnings("ignore")
STEPS, SAVE_AT, BLOCK = 8, 4, 64
# The Trainer moves the model to the GPU where there is one (after the optimizer was made), as
# it does for its users; there, kernels that make runs bit-reproducible, as the resumed run is
# compared with the straight one to the bit (CI has no GPU: the CPU is deterministic)
GPU = torch.cuda.is_available()
if GPU:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, name):
            getattr(torch.backends.cuda, name)(False)


def text_blocks(n):
    """n blocks of BLOCK bytes of this repository's own text: a byte-level vocabulary."""
    here = os.path.dirname(os.path.abspath(__file__))
    data = b""
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                data += f.read()
    ids = torch.tensor(list(data[: n * BLOCK]), dtype=torch.long).view(n, BLOCK)
    return [{"input_ids": row, "labels": row} for row in ids]


def gpt2(seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=256, n_positions=BLOCK, n_embd=64, n_layer=2, n_head=4)
    return GPT2LMHeadModel(config)


def trainer(model, where, overlap=False, epochs=None, **kw):
    """STEPS steps saving every SAVE_AT; or `epochs` epochs of SAVE_AT steps, saving each."""
    span = dict(max_steps=STEPS, save_steps=SAVE_AT, save_strategy="steps") if epochs is None \
        else dict(num_train_epochs=epochs, save_strategy="epoch")
    args = TrainingArguments(output_dir=where, per_device_train_batch_size=4, logging_steps=1,
                             report_to=[], use_cpu=not GPU, seed=0, data_seed=0,
                             dataloader_num_workers=0, disable_tqdm=True, **span)
    # Under srun --zenflow-bind the worker takes the plan (ZENFLOW_OPT_*); elsewhere one thread.
    threads = None if "ZENFLOW_OPT_CPUS" in os.environ else 1
    opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                   threads=threads, overlap=overlap)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - step / (2 * STEPS))
    data = text_blocks(4 * (STEPS if epochs is None else SAVE_AT))
    return Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, sched), **kw), opt


class Unedited(Trainer if transformers else object):
    """A Trainer that leaves the gradients alone after backward, as transformers 4 does with
    max_grad_norm=0: transformers 5 computes the norm it logs with clip_grad_norm_(inf) at every
    step, which multiplies every .grad by 1.0 in place, an edit that step() copies again."""

    def _get_grad_norm(self, model, grad_norm=None):
        return grad_norm


def out_of_memory_at(n):
    """A forward pre-hook that raises, at the model's n-th forward, the error accelerate takes
    for the CPU running out of memory (auto_find_batch_size then retries with a smaller batch)."""
    count = [0]

    def hook(module, inputs):
        count[0] += 1
        if count[0] == n:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory (a test's)")
    return hook


def ddp_rank(rank, world, port, out):
    """One rank of a Trainer under DDP, environment as torchrun sets it, CPU and gloo: the model
    trained with torch's AdamW, ours with the callback and ours without; then torch's and ours
    with auto_find_batch_size, the second step failing for memory (the Trainer drops its DDP and
    wraps the model anew). Rank 0 saves each run's parameters, and for ours the gradients each
    step() found as DDP's reduction left them."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                      USE_LIBUV="0")  # Debian's torch 2.x has no libuv
    import zenflow_bind.hf
    got = {}
    for case in ("torch", "ours", "ours_by_default", "torch_oom", "ours_oom"):
        model = gpt2()
        oom = case.endswith("_oom")
        if oom:
            model.register_forward_pre_hook(out_of_memory_at(3))
        with tempfile.TemporaryDirectory() as where:
            # max_grad_norm=0: the Trainer's clip_grad_norm_ would edit every gradient after
            # backward, and step() copy each again (clip in the optimizer instead; Unedited)
            # two micro-batches a step: the first under DDP's no_sync(), as the Trainer runs it
            args = TrainingArguments(output_dir=where, per_device_train_batch_size=2,
                                     gradient_accumulation_steps=2,
                                     max_steps=STEPS, save_strategy="no", report_to=[],
                                     use_cpu=True, ddp_backend="gloo", max_grad_norm=0,
                                     seed=0, data_seed=0, dataloader_num_workers=0,
                                     disable_tqdm=True, auto_find_batch_size=oom)
            found = []
            if case.startswith("torch"):
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            else:
                opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                               threads=1)
                opt.register_step_pre_hook(lambda opt, args, kwargs: found.append(
                    sum(s.unchanged_since_staged(opt._buffer) for s in opt._ddp_slots.values())))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - step / (2 * STEPS))
            # by default the callback registers an optimizer of CUDA parameters alone: a CPU
            # one's gradients are in the worker's buffer already, where DDP averages them
            callbacks = [] if case.startswith("torch") else \
                [zenflow_bind.hf.Synchronize(register_ddp=case != "ours_by_default" or None)]
            Unedited(model=model, args=args, train_dataset=text_blocks(4 * STEPS),
                     optimizers=(opt, sched), callbacks=callbacks).train()
            got[case] = ([p.detach().clone() for p in model.parameters()], found)
            if not case.startswith("torch"):
                opt.close()
    if rank == 0:
        torch.save(got, out)


@unittest.skipIf(transformers is None, "transformers is not installed")
class HuggingFaceTrainer(unittest.TestCase):
    def test_trains_saves_and_resumes(self):
        self.resumes_where_a_straight_run_ends()

    def test_overlap_with_the_synchronize_callback(self):
        # overlap=True leaves the model a step behind the optimizer: without the callback the
        # checkpoint's model file is a step older than its optimizer state, and a resumed run
        # goes elsewhere
        import zenflow_bind.hf
        sync = [zenflow_bind.hf.Synchronize()]
        self.resumes_where_a_straight_run_ends(overlap=True, callbacks=sync)
        # saved at each epoch's end, which no step end announces
        self.resumes_where_a_straight_run_ends(overlap=True, callbacks=sync, epochs=True)

    def test_the_callback_says_when_it_has_no_optimizer(self):
        import zenflow_bind.hf
        state = transformers.TrainerState()
        control = transformers.TrainerControl()
        for optimizer in (None, torch.optim.AdamW(gpt2().parameters())):
            with self.assertWarnsRegex(UserWarning, r"Synchronize\(optimizer\)"):
                zenflow_bind.hf.Synchronize().on_train_begin(None, state, control,
                                                             optimizer=optimizer)

    @unittest.skipUnless(torch.distributed.is_available() and
                         torch.distributed.is_gloo_available(), "no gloo")
    def test_the_callback_takes_the_ddp_that_runs_the_model(self):
        import gc
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel
        import zenflow_bind.hf
        state, control = transformers.TrainerState(), transformers.TrainerControl()
        x = torch.ones(2, 4)

        def begin(net, opt, register_ddp=True):  # (CPU parameters: registered when asked)
            zenflow_bind.hf.Synchronize(register_ddp=register_ddp).on_train_begin(
                None, state, control, model=net, optimizer=opt)

        # one process, no process group: no DDP can come, and the model gets no hook (one
        # would break Module.compile(fullgraph=True))
        net = torch.nn.Linear(4, 4)
        with zenflow_bind.optim.AdamW(net.parameters(), threads=1) as opt:
            begin(net, opt)
            self.assertFalse(net._forward_pre_hooks)
        # worker=False has nothing to take from DDP (and no worker to ask about)
        begin(net, zenflow_bind.optim.AdamW(net.parameters(), worker=False))
        self.assertFalse(net._forward_pre_hooks)
        with tempfile.TemporaryDirectory() as where:
            dist.init_process_group("gloo", store=dist.FileStore(os.path.join(where, "s"), 1),
                                    rank=0, world_size=1)
            try:
                for other_hook in (False, True):
                    net = torch.nn.Linear(4, 4)
                    ddp = DistributedDataParallel(net)
                    if other_hook:  # DDP's one communication hook, set through accelerate
                        ddp.register_comm_hook(None, allreduce_hook)
                    # train()s that failed before any forward left their hooks: one with its
                    # optimizer closed, one with it dropped (held weakly: freed, its
                    # parameters free for another)
                    closed = zenflow_bind.optim.AdamW(net.parameters(), threads=1)
                    begin(net, closed)
                    closed.close()
                    dropped = zenflow_bind.optim.AdamW(net.parameters(), threads=1)
                    begin(net, dropped)
                    del dropped
                    gc.collect()
                    opt = zenflow_bind.optim.AdamW(net.parameters(), threads=1)
                    begin(net, opt)
                    with torch.no_grad():
                        net.eval()
                        ddp(x)  # an evaluation
                        net.train()
                        net(x)  # a pass of the unwrapped model (a reference model's)
                    self.assertFalse(opt._ddp_slots)
                    with warnings.catch_warnings(record=True) as said:
                        warnings.simplefilter("always")
                        ddp(x).sum().backward()
                    said = [str(w.message) for w in said if "zenflow_bind" in str(w.message)]
                    if other_hook:
                        self.assertEqual(len(said), 1)
                        self.assertIn("taken after backward", said[0])
                    else:
                        self.assertEqual(said, [])
                    self.assertEqual(len(opt._ddp_slots), 0 if other_hook else 2)
                    self.assertFalse(net._forward_pre_hooks)  # each hook saw it, and went
                    opt.step()  # training goes on either way
                    opt.close()
                # by default, an optimizer of CPU parameters is not registered
                net = torch.nn.Linear(4, 4)
                ddp = DistributedDataParallel(net)
                with zenflow_bind.optim.AdamW(net.parameters(), threads=1) as opt:
                    begin(net, opt, register_ddp=None)
                    ddp(x).sum().backward()
                    self.assertFalse(opt._ddp_slots)
                    self.assertFalse(net._forward_pre_hooks)
                    opt.step()
            finally:
                dist.destroy_process_group()

    @unittest.skipUnless(torch.distributed.is_available() and
                         torch.distributed.is_gloo_available(), "no gloo")
    def test_under_ddp_the_callback_takes_the_reduced_gradients(self):
        import torch.multiprocessing as mp
        with socket.socket() as s:  # a free port for the ranks' rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as where:
            out = os.path.join(where, "out.pt")
            mp.spawn(ddp_rank, args=(2, port, out), nprocs=2)
            got = torch.load(out)
        params = len(got["torch"][0])
        # (after the failed second step, STEPS more steps on a DDP made anew)
        for case, want in (("ours", [params] * STEPS), ("ours_by_default", [0] * STEPS),
                           ("ours_oom", [params] * (1 + STEPS))):
            ours, found = got[case]
            theirs, _ = got["torch_oom" if case.endswith("_oom") else "torch"]
            with self.subTest(case=case):
                for a, b in zip(ours, theirs):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                # with the callback, every gradient step() finds is the one taken from DDP's
                # reduction during backward: none is copied again
                self.assertEqual(found, want)

    def resumes_where_a_straight_run_ends(self, epochs=False, **kw):
        with tempfile.TemporaryDirectory() as straight_dir, \
                tempfile.TemporaryDirectory() as resumed_dir:
            straight, opt = trainer(gpt2(), straight_dir, epochs=2 if epochs else None, **kw)
            straight.train()
            planned = os.environ.get("ZENFLOW_OPT_CPUS")
            if planned:  # under srun --zenflow-bind: the worker runs where the plugin planned
                print(f"ZENFLOW_OPT_CPUS={planned} worker threads on "
                      f"{sorted({cpu for _, cpu in opt.worker.threads()})}")
            opt.close()
            losses = [e["loss"] for e in straight.state.log_history if "loss" in e]
            self.assertLess(losses[-1], losses[0])

            # resumed from the checkpoint written mid-run (an epoch's end, or a step's)
            checkpoint = os.path.join(straight_dir, f"checkpoint-{SAVE_AT}")
            self.assertTrue(os.path.exists(os.path.join(checkpoint, "optimizer.pt")))

            resumed, opt = trainer(gpt2(seed=1), resumed_dir, epochs=2 if epochs else None,
                                   **kw)  # weights from the checkpoint
            resumed.train(resume_from_checkpoint=checkpoint)
            self.assertEqual(float(opt.state_dict()["state"][0]["step"]), float(STEPS))
            opt.close()
            for a, b in zip(resumed.model.parameters(), straight.model.parameters()):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
