#!/usr/bin/python3
"""Train a small transformer language model with zenflow_bind.optim.AdamW or torch.optim.AdamW.

The model (torch.nn.TransformerEncoder with a causal mask) learns a seeded synthetic language:
each token is a fixed permutation of the one before it, with a tenth of the tokens replaced
by noise. Every batch is drawn from a generator seeded by (seed, step), so a run resumed from a
checkpoint sees the same data as a run that never stopped.

With --optimizer zenflow the AdamW step runs in a zenflow-optimizer worker on the optimizer CPUs
of the task (ZENFLOW_OPT_CPUS from `srun --zenflow-bind`), overlapped with the next forward and
backward pass (one step stale, as ZenFlow). With --optimizer torch it is torch.optim.AdamW in
this process. --save-at K writes model + optimizer state dicts after step K (synchronizing the
worker first); --stop-at-save ends the run there and --resume continues from the file.

By hand, from the source tree after `cmake --build --preset default`, on a Slurm cluster whose
plugstack.conf loads zenflow_bind.so (scripts/cluster.sh makes one on loopback):

    export PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
           ZENFLOW_OPTIMIZER=build/default/optimizer/zenflow-optimizer
    srun -n1 -c2 --zenflow-bind=verbose /usr/bin/python3 contrib/demo/train_transformer.py \\
         --optimizer zenflow --steps 100 --save-at 50 --checkpoint /tmp/ck.pt --stop-at-save
    srun -n1 -c2 --zenflow-bind=verbose /usr/bin/python3 contrib/demo/train_transformer.py \\
         --optimizer zenflow --steps 100 --resume /tmp/ck.pt
    srun -n1 -c2 /usr/bin/python3 contrib/demo/train_transformer.py --optimizer torch --steps 100

--log FILE appends one JSON object per step and one per run segment (CPUs, memory);
contrib/demo/report.py turns two such logs into a table and a picture.
"""

import argparse
import json
import math
import os
import time

import torch


class TinyLM(torch.nn.Module):
    """Token + position embeddings, pre-norm encoder layers under a causal mask, a linear head."""

    def __init__(self, vocab, seq, width, layers, heads):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)
        # -inf above the diagonal: a token sees only those before it
        self.register_buffer("causal", torch.full((seq, seq), -math.inf).triu(1),
                             persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        n = tokens.shape[1]
        return self.head(self.norm(self.encoder(x, mask=self.causal[:n, :n])))


def batch(seed, step, args):
    """Inputs and next-token targets of one step, the same whoever asks for them."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    n = args.seq + 1
    tokens = torch.empty(args.batch, n, dtype=torch.long)
    tokens[:, 0] = torch.randint(args.vocab, (args.batch,), generator=g)
    for t in range(1, n):
        tokens[:, t] = (5 * tokens[:, t - 1] + 3) % args.vocab
    noise = torch.rand(args.batch, n, generator=g) < 0.1
    tokens[noise] = torch.randint(args.vocab, (int(noise.sum()),), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def make_optimizer(name, model, args):
    kwargs = dict(lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    if name == "torch":
        return torch.optim.AdamW(model.parameters(), **kwargs)
    import zenflow_bind.optim
    return zenflow_bind.optim.AdamW(model.parameters(), overlap=True, **kwargs)


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


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", choices=("zenflow", "torch"), default="zenflow")
    ap.add_argument("--steps", type=int, default=100, help="last step of the whole run")
    ap.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    ap.add_argument("--checkpoint", default="checkpoint.pt")
    ap.add_argument("--stop-at-save", action="store_true", help="end the run at the checkpoint")
    ap.add_argument("--resume", metavar="CHECKPOINT", help="continue from this checkpoint")
    ap.add_argument("--log", help="append per-step JSON lines here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    """Run (a segment of) the training; returns the model, its weights after the last step."""
    args = parse(argv)
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.seq, args.width, args.layers, args.heads)
    numel = sum(p.numel() for p in model.parameters())
    start, checkpoint = 0, None
    if args.resume:
        checkpoint = torch.load(args.resume)
        # the model first: the optimizer takes its fp32 masters from it
        model.load_state_dict(checkpoint["model"])
        start = checkpoint["step"]
    opt = make_optimizer(args.optimizer, model, args)
    if checkpoint is not None:
        opt.load_state_dict(checkpoint["optimizer"])
    zenflow = args.optimizer == "zenflow"
    log = open(args.log, "a") if args.log else None
    stop = args.save_at if args.stop_at_save else args.steps
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    say(f"{args.optimizer}: {numel} parameters, steps {start + 1}..{stop}, training CPUs "
        f"{cpu_list(os.sched_getaffinity(0))} ({torch.get_num_threads()} threads)")
    loss_fn = torch.nn.CrossEntropyLoss()
    state_bytes = None
    for step in range(start + 1, stop + 1):
        x, y = batch(args.seed, step, args)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        first_torch_step = not zenflow and step == 1
        rss = rss_bytes() if first_torch_step else 0
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if first_torch_step:
            state_bytes = rss_bytes() - rss  # torch allocates the moments at the first step
        # the worker's own time for the step that step() just finished (the one before), or
        # torch's step, which the training process runs itself
        opt_ms = opt.last_step_seconds * 1e3 if zenflow else (t2 - t1) * 1e3
        record = {"step": step, "loss": loss.item(), "step_ms": (t2 - t0) * 1e3,
                  "compute_ms": (t1 - t0) * 1e3, "blocked_ms": (t2 - t1) * 1e3,
                  "opt_ms": opt_ms if (not zenflow or step > start + 1) else None}
        if log:
            log.write(json.dumps(record) + "\n")
        if step % 20 == 0 or step == stop:
            say(f"step {step:4d}  loss {record['loss']:.4f}  step {record['step_ms']:.1f} ms")
        if step == args.save_at:
            if zenflow:
                opt.synchronize()  # the last update into the model before it is saved
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step}, args.checkpoint)
            say(f"checkpoint after step {step}: {args.checkpoint}")
    if zenflow:
        opt.synchronize()
    segment = {"segment": True, "optimizer": args.optimizer, "first": start + 1, "last": stop,
               "numel": numel, "train_cpus": cpu_list(os.sched_getaffinity(0)),
               "train_threads": torch.get_num_threads(), "eval_loss": eval_loss(model, args)}
    if zenflow:
        mem = opt.worker.memory()
        threads = opt.worker.threads()
        segment.update(opt_cpus=cpu_list({cpu for _, cpu in threads}), opt_threads=len(threads),
                       bytes_per_param=mem["bytes_per_param"],
                       worker_rss_per_param=mem["worker_rss"] / numel)
        opt.close()
    else:
        segment.update(opt_cpus=segment["train_cpus"], opt_threads=segment["train_threads"])
        if state_bytes is not None:
            # what the worker's report counts, measured here: parameters and gradients
            # (4 + 4 bytes) plus the RSS the first step added for the moments
            segment["bytes_per_param"] = 8 + state_bytes / numel
    say(f"held-out loss after step {stop}: {segment['eval_loss']:.4f}")
    if log:
        log.write(json.dumps(segment) + "\n")
        log.close()
    return model


@torch.no_grad()
def eval_loss(model, args):
    """The loss on a batch no step trained on (negative step numbers are never drawn)."""
    x, y = batch(args.seed, -1, args)
    return torch.nn.functional.cross_entropy(model(x).reshape(-1, args.vocab),
                                             y.reshape(-1)).item()


if __name__ == "__main__":
    main()
