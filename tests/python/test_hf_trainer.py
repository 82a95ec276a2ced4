"""zenflow_bind.optim.AdamW in Hugging Face transformers' Trainer, as a user passes it:
Trainer(..., optimizers=(AdamW(...), scheduler)) on a GPT-2 built from a config (no download),
text from this source tree with a byte-level vocabulary. It trains (the loss falls), saves a
checkpoint, and a new Trainer with a new optimizer resumed from it ends where an uninterrupted run
does; on the GPU where the machine has one. Skips where transformers is not installed (Debian
forky's python3-transformers has it; CI runs this file there)."""

import os
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
