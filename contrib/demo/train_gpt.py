#!/usr/bin/python3
"""Train a GPT-style decoder (transformers' GPT-2, built from a config: nothing is downloaded) on
text this machine ships, with one of three AdamW steps:

    zenflow      zenflow_bind.optim.AdamW: the step in a pinned zenflow-optimizer worker on the
                 task's optimizer CPUs (ZENFLOW_OPT_CPUS from `srun --zenflow-bind`), each bucket
                 stepped as soon as backward has produced its gradients
    torch        torch.optim.AdamW() as a user gets it by default
    torch-fused  torch.optim.AdamW(fused=True), torch's fused CPU kernel

The text is the byte stream of Debian's licence texts (/usr/share/common-licenses) and this
project's own documentation (README, man pages), 256 byte values as the vocabulary; its last
tenth is held out. The batch of step k is drawn by a generator seeded by (seed, k), so a run
resumed from a checkpoint sees what a run that never stopped sees.

--save-at K writes a torch.distributed.checkpoint (DCP) directory of the model and optimizer
after step K; --stop-at-save ends the run there and --resume DIR continues from it, in another
process (scripts/demo.sh: another srun step). --log FILE appends one JSON object per step (its
times, and the page faults the training process took in it) and one per run segment (CPUs,
memory, held-out loss); contrib/demo/report.py compares such logs. On a GPU, two runs of one
command are bit-identical only with --deterministic (bench/gpu_run.sh demo passes it).

By hand, inside the forky root (`bash tests/roots/debian_root.sh forky shell`) after a build:
    PYTHONPATH=python ZENFLOW_BIND_LIB=build/.../libzenbind.so.2 \\
    ZENFLOW_OPTIMIZER=build/.../zenflow-optimizer \\
    srun -n1 -c2 --zenflow-bind python3 contrib/demo/train_gpt.py --optimizer zenflow --steps 40
"""

import argparse
import glob
import hashlib
import json
import os
import resource
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
SOURCES = ("/usr/share/common-licenses/*", "README.md", "man/*.[0-9]", "bench/README.md")


def corpus(root):
    """The training and held-out bytes: every source file, in name order, as one stream."""
    paths = []
    for pattern in SOURCES:
        paths += sorted(glob.glob(pattern if pattern.startswith("/") else
                                  os.path.join(root, pattern)))
    data = bytearray()
    for path in paths:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                data += f.read()
    if len(data) < 1 << 16:
        raise SystemExit(f"train_gpt.py: only {len(data)} bytes of text under {SOURCES}")
    text = torch.frombuffer(data, dtype=torch.uint8).long()
    cut = len(text) * 9 // 10
    return text[:cut], text[cut:], len(paths)


def batch(text, seed, step, args, device="cpu"):
    """Inputs and next-byte targets of one step, the same whoever asks for them."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(len(text) - args.seq - 1, (args.batch,), generator=g)
    rows = torch.stack([text[s:s + args.seq + 1] for s in starts.tolist()]).to(device)
    return rows[:, :-1], rows[:, 1:]


def sync(device):
    """Times on a GPU end when its work does."""
    if device != "cpu":
        torch.cuda.synchronize(device)


def make_model(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=args.width,
                        n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None)
    torch.manual_seed(args.seed)
    return GPT2LMHeadModel(config)


def deterministic():
    """A GPU's training, otherwise not bit-reproducible run to run: cuBLAS's split reductions,
    atomics in backward kernels (torch's deterministic algorithms) and SDPA's fused attention
    backward (the math kernel instead). A CPU run is deterministic without it."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, name):
            getattr(torch.backends.cuda, name)(False)


def make_optimizer(name, model, args):
    kwargs = dict(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    if name == "torch":
        return torch.optim.AdamW(model.parameters(), **kwargs)
    if name == "torch-fused":
        return torch.optim.AdamW(model.parameters(), fused=True, **kwargs)
    import zenflow_bind.optim
    return zenflow_bind.optim.AdamW(model.parameters(), **kwargs)


def checkpoint(model, opt, step, where, load=False):
    """DCP save (or load, in place) of the model, the optimizer and the step count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt),
          "step": torch.tensor(step)}
    if not load:
        dcp.save(sd, checkpoint_id=where)
        return step
    dcp.load(sd, checkpoint_id=where)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])
    return int(sd["step"])


def cpu_list(cpus):
    """Linux cpu-list format (0-3,8) of a set of CPU numbers."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def host_bytes(model, opt):
    """Bytes of parameters, gradients and optimizer state (torch's: every tensor of opt.state)
    in host memory: none of a model and optimizer that live on the GPU."""
    def size(tensors):
        return sum(t.numel() * t.element_size() for t in tensors
                   if torch.is_tensor(t) and t.device.type == "cpu")
    params = size(model.parameters())
    grads = size(p.grad for p in model.parameters())
    state = size(v for st in opt.state.values() for v in st.values())
    return params + grads + state


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", choices=("zenflow", "torch", "torch-fused"),
                    default="zenflow")
    ap.add_argument("--steps", type=int, default=200, help="last step of the whole run")
    ap.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    ap.add_argument("--checkpoint", default="checkpoint.dcp", help="DCP directory")
    ap.add_argument("--stop-at-save", action="store_true", help="end the run at the checkpoint")
    ap.add_argument("--resume", metavar="DIR", help="continue from this DCP checkpoint")
    ap.add_argument("--log", help="append per-step JSON lines here")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."),
                    help="the source tree whose documentation is part of the text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the model trains (default: the GPU when there is one); the "
                         "zenflow optimizer steps on the CPU beside it in every case")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch's deterministic kernels on a GPU (and math attention): two runs "
                         "of one command give the same weights, bit for bit")
    return ap.parse_args(argv)


def main(argv=None):
    """Run (a segment of) the training; returns the model, its weights after the last step."""
    args = parse(argv)
    if args.deterministic:
        deterministic()
    train_text, held_out, nfiles = corpus(args.root)
    model = make_model(args).to(args.device)
    numel = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(args.optimizer, model, args)
    start = checkpoint(model, opt, 0, args.resume, load=True) if args.resume else 0
    zenflow = args.optimizer == "zenflow"
    log = open(args.log, "a") if args.log else None
    stop = args.save_at if args.stop_at_save else args.steps
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    say(f"{args.optimizer} on {args.device}: GPT-2 of {numel / 1e6:.1f}M parameters on "
        f"{len(train_text)} bytes of {nfiles} files, steps {start + 1}..{stop}, training CPUs "
        f"{cpu_list(os.sched_getaffinity(0))} ({torch.get_num_threads()} threads)")
    model.train()
    for step in range(start + 1, stop + 1):
        x, y = batch(train_text, args.seed, step, args, args.device)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        if zenflow:
            with opt.step_during_backward():
                loss.backward()
        else:
            loss.backward()
        sync(args.device)
        t1 = time.perf_counter()
        opt.step()
        sync(args.device)
        t2 = time.perf_counter()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        # the worker's own time for the whole step (buckets during backward and the rest), or
        # torch's step, which the training process runs itself
        opt_ms = opt.last_step_seconds * 1e3 if zenflow else (t2 - t1) * 1e3
        record = {"step": step, "loss": loss.item(), "step_ms": (t2 - t0) * 1e3,
                  "compute_ms": (t1 - t0) * 1e3, "blocked_ms": (t2 - t1) * 1e3,
                  "opt_ms": opt_ms, "tokens": x.numel(), "faults": faults}
        if log:
            log.write(json.dumps(record) + "\n")
        if step % 10 == 0 or step == stop:
            say(f"step {step:4d}  loss {record['loss']:.4f}  step {record['step_ms']:.1f} ms")
        if step == args.save_at:
            checkpoint(model, opt, step, args.checkpoint)
            say(f"checkpoint after step {step}: {args.checkpoint} (DCP)")
    segment = {"segment": True, "optimizer": args.optimizer, "first": start + 1, "last": stop,
               "numel": numel, "train_cpus": cpu_list(os.sched_getaffinity(0)),
               "train_threads": torch.get_num_threads(), "device": args.device,
               "eval_loss": eval_loss(model, held_out, args), "torch": torch.__version__,
               "params_sha256": digest(model)}
    if zenflow:
        mem = opt.worker.memory()
        threads = opt.worker.threads()
        segment.update(opt_cpus=cpu_list({cpu for _, cpu in threads}), opt_threads=len(threads),
                       bytes_per_param=mem["bytes_per_param"])
        opt.close()
    else:
        segment.update(opt_cpus=segment["train_cpus"], opt_threads=segment["train_threads"])
        segment["bytes_per_param"] = host_bytes(model, opt) / numel
    say(f"held-out loss after step {stop}: {segment['eval_loss']:.4f}")
    if log:
        log.write(json.dumps(segment) + "\n")
        log.close()
    return model


def digest(model):
    """SHA-256 of every parameter's bytes, in order: equal only for bit-identical weights."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def lm_loss(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def eval_loss(model, held_out, args):
    """The mean loss over 8 held-out batches no step trained on."""
    model.eval()
    losses = [lm_loss(model, *batch(held_out, args.seed, -1 - k, args, args.device)).item()
              for k in range(8)]
    model.train()
    return sum(losses) / len(losses)


if __name__ == "__main__":
    main()
