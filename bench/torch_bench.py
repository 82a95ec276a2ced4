#!/usr/bin/python3
"""zenflow_bind.optim.AdamW (blocking and overlap) against torch.optim.AdamW (foreach on and off)
on the same cores and models; prints figures and ratios from one run. Not a test.

Each configuration runs in its own child process, so that its /proc RSS is its own; the
configurations take turns --repeat times and the best median of each is kept. torch gets
torch.set_num_threads(T) and the worker T threads, both on the same CPUs (the process's
affinity). Models: a flat one (--flat-params parameters in 8 tensors, loss = sum(p * c), so the
backward pass is one multiply) and a small torch.nn.Transformer. bf16 runs give torch an fp32
master (grads copied in, weights copied out), the same math as the worker's. Every configuration
runs with torch.set_flush_denormal(True): without it Debian's CPU torch spends seconds per step in
denormal arithmetic on the Transformer, which would swamp every other figure.

Bytes/param count what the run adds to the processes' memory beyond the model's inputs, after
malloc_trim: torch's RssAnon growth; for the worker, this process's private growth, the worker's
private memory and the shared memory reserved (each shared page counted once).

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
    ZENFLOW_OPTIMIZER=build/default/optimizer/zenflow-optimizer /usr/bin/python3 bench/torch_bench.py
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

from machine import cpu_name, load, memory_settings

OPTIMIZERS = ("torch-foreach", "torch-loop", "zenflow", "zenflow-overlap")


def rss():
    """This process's VmRSS, RssAnon and RssShmem in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def inputs(model_kind, dtype, flat_params):
    """The loss's constant inputs, made before the memory baseline."""
    import torch
    torch.manual_seed(0)
    if model_kind == "flat":
        return torch.full((flat_params // 8,), 1e-3, dtype=dtype)
    # 16 tokens: Debian's torch has a generic BLAS, and the optimizer is what is measured here
    return torch.randn(8, 2, 256).to(dtype), torch.randn(8, 2, 256).to(dtype)


def build(model_kind, dtype, flat_params, data):
    import torch
    if model_kind == "flat":
        params = [torch.nn.Parameter((torch.randn(flat_params // 8) * 0.02).to(dtype))
                  for _ in range(8)]

        def loss_fn():
            return sum((p * data).sum() for p in params)
        return params, loss_fn
    model = torch.nn.Transformer(d_model=256, nhead=4, num_encoder_layers=2,
                                 num_decoder_layers=2, dim_feedforward=1024, dropout=0.0)
    model = model.to(dtype)

    def loss_fn():
        return model(*data).float().square().mean()
    return list(model.parameters()), loss_fn


def run_one(args):
    """One configuration in this process: prints one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    data = inputs(args.model, dtype, args.flat_params)
    base = rss()
    params, loss_fn = build(args.model, dtype, args.flat_params, data)
    numel = sum(p.numel() for p in params)
    master = None
    if args.opt.startswith("zenflow"):
        import zenflow_bind.optim as zt
        opt = zt.AdamW(params, lr=1e-4, threads=args.threads, overlap=args.opt.endswith("overlap"))
    else:
        targets = params
        if dtype != torch.float32:  # the same math as the worker's: an fp32 master
            master = [p.detach().float().requires_grad_() for p in params]
            targets = master
        opt = torch.optim.AdamW(targets, lr=1e-4, foreach=args.opt == "torch-foreach")

    def step():
        t0 = time.perf_counter()
        if master is not None:
            for m, p in zip(master, params):
                m.grad = p.grad.float()
        opt.step()
        if master is not None:
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
        return time.perf_counter() - t0

    opt_times, train_times = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_fn().backward()
        dt_opt = step()
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            opt_times.append(dt_opt)
            train_times.append(dt)
    if args.opt == "zenflow-overlap":
        opt.synchronize()
    # what is live, not what glibc keeps of freed blocks (the model's first private gradients,
    # torch's foreach temporaries): every configuration alike
    ctypes.CDLL(None).malloc_trim(0)
    mine = rss()
    out = {"opt": args.opt, "model": args.model, "dtype": args.dtype, "numel": numel,
           "opt_s": sorted(opt_times)[len(opt_times) // 2],
           "train_s": sorted(train_times)[len(train_times) // 2]}
    if args.opt.startswith("zenflow"):
        m = opt.worker.memory()
        out["worker_step_s"] = opt.last_step_seconds
        # shared buffers counted once: this process's private growth, the worker's private
        # memory, and the shared memory reserved
        unique = (mine["RssAnon"] - base["RssAnon"]) + m["worker_rss_anon"] + m["shm_reserved"]
        out["layout_bytes_per_param"] = m["bytes_per_param"]
        out["split_bytes_per_param"] = {  # trainer private, worker private, shared
            "trainer": (mine["RssAnon"] - base["RssAnon"]) / numel,
            "worker": m["worker_rss_anon"] / numel, "shared": m["shm_reserved"] / numel}
        opt.close()
    else:
        unique = mine["RssAnon"] - base["RssAnon"]
    out["bytes_per_param"] = unique / numel
    print(json.dumps(out), flush=True)


def describe_machine(threads):
    cpus = sorted(os.sched_getaffinity(0))
    print(f"CPUs {cpus} ({cpu_name()}); torch threads = worker threads = {threads}; "
          f"load average {load()}")
    print(f"memory: {memory_settings()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--flat-params", type=int, default=100_000_000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration, best kept")
    ap.add_argument("--models", default="flat,transformer")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--one", nargs=3, metavar=("OPT", "MODEL", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        args.opt, args.model, args.dtype = args.one
        return run_one(args)

    describe_machine(args.threads)
    print(f"{'model':12} {'dtype':5} {'optimizer':16} {'params':>11} {'opt step':>10} "
          f"{'train step':>10} {'B/param':>8} {'opt vs foreach':>14} {'train vs foreach':>16}")
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            rows = {}
            # round robin, best of --repeat: other load on shared CPUs only ever slows a run down
            for _ in range(args.repeat):
                for opt in OPTIMIZERS:
                    cmd = [sys.executable, __file__, "--one", opt, model, dtype, "--threads",
                           str(args.threads), "--flat-params", str(args.flat_params), "--steps",
                           str(args.steps), "--warmup", str(args.warmup)]
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    if done.returncode != 0:
                        print(f"{model} {dtype} {opt}: failed\n{done.stderr}", file=sys.stderr)
                        continue
                    r = json.loads(done.stdout.splitlines()[-1])
                    best = rows.setdefault(opt, r)
                    for key in ("opt_s", "train_s"):
                        best[key] = min(best[key], r[key])
            ref = rows.get("torch-foreach")
            for opt, r in rows.items():
                ref = ref or r
                print(f"{model:12} {dtype:5} {opt:16} {r['numel']:11d} "
                      f"{r['opt_s'] * 1e3:8.2f}ms {r['train_s'] * 1e3:8.2f}ms "
                      f"{r['bytes_per_param']:8.1f} {ref['opt_s'] / r['opt_s']:13.2f}x "
                      f"{ref['train_s'] / r['train_s']:15.2f}x", flush=True)
    print(f"load average at the end {load()}; ratios > 1 mean faster than torch foreach")


if __name__ == "__main__":
    main()
