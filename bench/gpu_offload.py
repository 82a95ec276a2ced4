#!/usr/bin/python3
"""One training step of a GPT-style bf16 model on one CUDA GPU with four optimizers, against the
tokens per step; prints a table and the GPU, CPU and load. Not a test.

  gpu-fused   torch.optim.AdamW(fused=True) on the GPU: the optimizer state in GPU memory
  zenflow     zenflow_bind.optim.AdamW: the worker on this process's other CPUs, gradients out
              during backward, buckets stepped during backward (step_during_backward())
  zenflow-whole  the same with every bucket going back to the GPU once the step is whole, not
              as soon as the worker has stepped it (a diagnostic: what going back early saves)
  fsdp2       FSDP2 fully_shard(CPUOffloadPolicy()) on one rank, torch's fused CPU AdamW: the
              synchronous CPU step FSDP2 users have; fp32 parameters computed in bf16
              (MixedPrecisionPolicy), the same arithmetic as ours (fp32 master and moments)
  fsdp2-bf16  the same on the bf16 model as it is: bf16 parameters and moments on the CPU (half
              the bytes; updates below bf16's resolution are lost)
  naive       gradients .cpu(), torch's fused CPU AdamW on an fp32 master, parameters copied back
  ddp         zenflow's optimizer under DistributedDataParallel (one NCCL rank) without
              register_ddp(): what a DDP user gets, a plain step after backward that copies DDP's
              averages (the hooks' copies, made before DDP averaged, are dropped)
  ddp-registered  the same with opt.register_ddp(model) and step_during_backward(): each bucket's
              average taken as DDP reduces it, buckets stepped during backward (not in the
              default set: --variants gpu-fused,ddp,ddp-registered)

Each optimizer runs in its own child process (its memory is its own), all token counts in turn.
Columns: step time (forward + backward + step, CUDA synchronised, median) and its parts:
forward + backward (to the GPU's end of backward), the step's host part (step() returning) and
what the GPU still had to do after it (the copies back); peak GPU memory, the GPU memory step()
adds above what was allocated when it began (the copy-back spike), and host bytes per parameter
(RSS growth of this process plus the worker's private memory).

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
    ZENFLOW_OPTIMIZER=build/default/optimizer/zenflow-optimizer python3 bench/gpu_offload.py
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("gpu-fused", "zenflow", "fsdp2", "fsdp2-bf16", "naive")


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                yield int(line.split()[1]) * 1024


def host_bytes():
    return sum(rss_anon())


def gpt(args, dtype=None):
    """Decoder-only transformer, pre-norm, bf16 (or dtype), on cuda:0."""
    import torch
    torch.manual_seed(0)
    width = args.width

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
            self.proj = torch.nn.Linear(width, width, bias=False)
            self.up = torch.nn.Linear(width, 4 * width, bias=False)
            self.down = torch.nn.Linear(4 * width, width, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, args.heads, -1).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, width))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))

    class Gpt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(args.vocab, width)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(args.layers))
            self.ln = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, args.vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return Gpt().to("cuda", dtype or torch.bfloat16)


def run_variant(args):
    """One optimizer, every token count: one JSON line each."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    base = host_bytes()
    model = gpt(args, torch.float32 if args.variant == "fsdp2" else None)
    numel = sum(p.numel() for p in model.parameters())
    master = None
    if args.variant == "gpu-fused":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    elif args.variant.startswith(("zenflow", "ddp")):
        import zenflow_bind.optim
        if args.variant == "zenflow-whole":
            from zenflow_bind._layout import Slot
            Slot.can_go_early = lambda self, k: False
        cpus = sorted(os.sched_getaffinity(0))
        trainer = cpus[:args.trainer_cpus]
        os.sched_setaffinity(0, trainer)
        worker_cpus = cpus[args.trainer_cpus:] or cpus
        if args.variant.startswith("ddp"):
            import torch.distributed as dist
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29534")
            dist.init_process_group("nccl", rank=0, world_size=1)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-5,
                                       cpus=",".join(map(str, worker_cpus)),
                                       threads=len(worker_cpus))
        if args.variant == "ddp-registered":
            opt.register_ddp(model)
    elif args.variant.startswith("fsdp2"):
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
        policy = {"offload_policy": CPUOffloadPolicy()}
        if args.variant == "fsdp2":
            policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                       reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, **policy)
        fully_shard(model, **policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    else:
        master = [p.detach().float().cpu().pin_memory() for p in model.parameters()]
        for m in master:
            m.grad = torch.empty_like(m).pin_memory()
        opt = torch.optim.AdamW(master, lr=1e-5, fused=True)

    def step(tokens):
        """One training step: its parts in seconds, the copy-back spike and the peak."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 tokens[:, 1:].flatten())
        if args.variant.startswith("zenflow") or args.variant == "ddp-registered":
            with opt.step_during_backward():
                loss.backward()
        else:
            loss.backward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        peak = torch.cuda.max_memory_allocated()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if master is None:
            opt.step()
        else:
            for m, p in zip(master, model.parameters()):
                m.grad.copy_(p.grad)
            opt.step()
            for m, p in zip(master, model.parameters()):
                p.detach().copy_(m, non_blocking=True)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        spike = torch.cuda.max_memory_allocated() - before
        model.zero_grad()  # the naive master's gradients stay
        return {"step_s": t3 - t0, "fwd_bwd_s": t1 - t0, "host_s": t2 - t1, "gpu_after_s": t3 - t2,
                "spike": spike, "peak": max(peak, torch.cuda.max_memory_allocated())}

    for batch in args.batches:
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), device="cuda")
        try:
            for _ in range(args.warmup):
                step(tokens)
            runs = [step(tokens) for _ in range(args.steps)]
        except torch.OutOfMemoryError:  # this size and the larger ones do not fit
            print(json.dumps({"variant": args.variant, "tokens": batch * args.seq, "oom": True}),
                  flush=True)
            return
        extra = 0
        ours = args.variant.startswith(("zenflow", "ddp"))
        if ours:
            extra = opt.worker.memory()["worker_rss_anon"]
        row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        row.update(spike=max(r["spike"] for r in runs), peak_gpu=max(r["peak"] for r in runs))
        if ours:
            row["worker_step_s"] = opt.last_step_seconds
        print(json.dumps({"variant": args.variant, "numel": numel, "tokens": batch * args.seq,
                          "host_bytes_per_param": (host_bytes() - base + extra) / numel, **row}),
              flush=True)


def describe():
    import torch
    from machine import cpu_name, load, memory_settings
    print(f"GPU: {torch.cuda.get_device_name(0)}; CPU: {cpu_name()}, "
          f"{len(os.sched_getaffinity(0))} CPUs; load {load()}; torch {torch.__version__}")
    print(f"memory: {memory_settings()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))  # (ddp, ddp-registered: ask)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batches", default="1,2,4,8,16", help="sequences per step")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trainer-cpus", type=int, default=2,
                    help="zenflow, ddp: CPUs kept for this process; the worker gets the others")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.batches = [int(b) for b in str(args.batches).split(",")]
    if args.variant:
        return run_variant(args)
    import torch
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to measure")
        return 2
    describe()
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    rows, numel = {}, 0
    passed = [a for a, b in zip(sys.argv[1:], ["-"] + sys.argv[1:])  # all but --variants
              if not a.startswith("--variants") and b != "--variants"]
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--variant", variant] + passed
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{variant}: failed\n{out.stderr[-2000:]}")
        for line in out.stdout.splitlines():  # the rows it measured before it failed too
            r = json.loads(line)
            rows[(r["tokens"], variant)] = r
            numel = r.get("numel", numel)
    if not numel:
        return 1
    print(f"model: {numel / 1e9:.2f}B bf16 parameters; step time in ms (ratio to gpu-fused) = "
          "forward+backward + step's host part + GPU after it; peak GPU GiB; copy-back spike "
          "MiB; host bytes/param")
    for tokens in sorted({t for t, _ in rows}):
        ref = rows.get((tokens, "gpu-fused"))
        ref = None if ref is None or ref.get("oom") else ref
        for variant in args.variants.split(","):
            r = rows.get((tokens, variant))
            if r is None:
                continue
            if r.get("oom"):
                print(f"{tokens:7d} tokens  {variant:14s} out of GPU memory")
                continue
            ratio = f"{r['step_s'] / ref['step_s']:.2f}x" if ref else "-"
            parts = "+".join(f"{r[k] * 1e3:.0f}" for k in ("fwd_bwd_s", "host_s", "gpu_after_s"))
            worker = r.get("worker_step_s")
            worker = f"  worker {worker * 1e3:.0f} ms" if worker is not None else ""
            print(f"{tokens:7d} tokens  {variant:14s} {r['step_s'] * 1e3:8.1f} ms ({ratio:>6s})"
                  f" = {parts:15s} peak {r['peak_gpu'] / 2**30:6.1f}"
                  f"  spike {r['spike'] / 2**20:8.1f}"
                  f"  host {r['host_bytes_per_param']:5.1f}{worker}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
