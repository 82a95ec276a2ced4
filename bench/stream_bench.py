#!/usr/bin/python3
"""A CPU training step with and without AdamW.step_during_backward(), alternated step by step in
one run on one optimizer; prints the CPU, the load and the medians. Not a test.

Training (forward and backward) runs on --train-cpus with torch.set_num_threads(len), the worker
on --worker-cpus, as srun --zenflow-bind splits a task's cores. The model is an MLP of --layers
square Linear layers of --width (bucket_elements: about one layer per bucket), fp32 or bf16;
--batch rows set how long backward takes against the optimizer step. Without
step_during_backward() the worker starts when backward has ended; with it, each bucket starts as
soon as backward has produced its gradients. torch >= 2.1 (post-accumulate-grad hooks).

--ddp wraps the model in DistributedDataParallel (one gloo rank; --bucket-view for
gradient_as_bucket_view, --find-unused for find_unused_parameters) and compares what a DDP user
has without register_ddp(), a step after backward that copies DDP's averages, with
opt.register_ddp(model) and step_during_backward(), which takes each bucket's average as DDP
reduces it (two models and optimizers, alternated).
--after steps the registered model after backward too, as a loop that never steps during
backward does (the Hugging Face Trainer): what register_ddp() alone costs or saves there.

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
    ZENFLOW_OPTIMIZER=build/default/optimizer/zenflow-optimizer python3 bench/stream_bench.py
"""

import argparse
import os
import statistics
import time

import torch

import zenflow_bind.optim
from machine import cpu_name, load, memory_settings


def main():
    cpus = sorted(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    half = max(len(cpus) // 2, 1)
    ap.add_argument("--train-cpus", default=",".join(map(str, cpus[:half])))
    ap.add_argument("--worker-cpus", default=",".join(map(str, cpus[half:] or cpus)))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--steps", type=int, default=10, help="steps of each kind, alternated")
    ap.add_argument("--ddp", action="store_true", help="under DistributedDataParallel")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP's gradient_as_bucket_view (with --ddp)")
    ap.add_argument("--find-unused", action="store_true",
                    help="DDP's find_unused_parameters (with --ddp)")
    ap.add_argument("--after", action="store_true",
                    help="with --ddp: the registered model also steps after backward")
    args = ap.parse_args()

    train = [int(c) for c in args.train_cpus.split(",")]
    os.sched_setaffinity(0, train)
    torch.set_num_threads(len(train))
    torch.set_flush_denormal(True)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.ddp:
        import tempfile
        import torch.distributed as dist
        store = tempfile.NamedTemporaryFile(prefix="stream_bench.")
        dist.init_process_group("gloo", store=dist.FileStore(store.name, 1), rank=0,
                                world_size=1)

    def make():
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).to(dtype)
        if args.ddp:
            model = torch.nn.parallel.DistributedDataParallel(
                model, gradient_as_bucket_view=args.bucket_view,
                find_unused_parameters=args.find_unused)
        opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-5, cpus=args.worker_cpus,
                                       threads=len(args.worker_cpus.split(",")),
                                       bucket_elements=args.width * (args.width + 1))
        return model, opt

    runs = {False: make()}
    runs[True] = make() if args.ddp else runs[False]
    if args.ddp:
        runs[True][1].register_ddp(runs[True][0])
    model, opt = runs[False]
    numel = sum(p.numel() for p in model.parameters())
    x = torch.randn(args.batch, args.width, dtype=dtype)
    buckets = sum(len(l.buckets) for l in opt._layouts if l)
    print(f"CPU: {cpu_name()}; training on CPUs {train} ({len(train)} torch threads), worker on "
          f"{args.worker_cpus}; load average {load()}")
    print(f"memory: {memory_settings()}")
    ddp = f"; DDP, one gloo rank, gradient_as_bucket_view={args.bucket_view}, " \
        f"find_unused_parameters={args.find_unused}" if args.ddp else ""
    print(f"model: {args.layers} x Linear({args.width}, {args.width}), {numel / 1e6:.1f}M "
          f"{args.dtype} parameters in {buckets} buckets; batch {args.batch}; torch "
          f"{torch.__version__}{ddp}")

    def one(during):
        model, opt = runs[during]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(x).float().square().mean()
        if during and not args.after:
            with opt.step_during_backward():
                loss.backward()
        else:
            loss.backward()
        t1 = time.perf_counter()
        opt.step()
        return time.perf_counter() - t0, time.perf_counter() - t1

    for during in (False, True):  # warm-up: first touch of every buffer
        one(during)
        one(during)
    times = {False: [], True: []}
    for _ in range(args.steps):
        for during in (False, True):
            times[during].append(one(during))
    plain = statistics.median(t for t, _ in times[False])
    streamed = statistics.median(t for t, _ in times[True])
    names = ("step after backward", "step_during_backward") if not args.ddp else \
        ("DDP, step after", "register_ddp, after" if args.after else "register_ddp, during")
    for during, name in zip((False, True), names):
        total = statistics.median(t for t, _ in times[during])
        tail = statistics.median(s for _, s in times[during])
        print(f"{name:22s} training step {total * 1e3:8.1f} ms   of which step() "
              f"{tail * 1e3:7.1f} ms")
    print(f"{names[1]} / {names[0]}: {streamed / plain:.3f} "
          f"(medians of {args.steps} alternated steps each)")
    for _, o in {id(r[1]): r for r in runs.values()}.values():
        o.close()
    if args.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
