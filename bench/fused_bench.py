#!/usr/bin/python3
"""The Adam step in the training process: zenflow_bind.optim.AdamW(worker=False) against torch's
fused CPU AdamW (torch.optim.AdamW(fused=True), torch >= 2.4), step by step, alternated in one
process. Prints figures and ratios; not a test.

Flat model: --params parameters (1) of --elements elements in all (fp32 or bf16), each with a
gradient set once (many small parameters measure what a step costs per tensor). Each
round times one step of each optimizer, in turns, after --warmup steps each; the table gives
medians over --rounds rounds and the median of the per-round ratios. Both use --threads threads
(torch.set_num_threads; ours its threads=). Bytes per element that each step must move:
  fp32  ours 28 (param, m, v read and written; grad read), torch fused 28
  bf16  ours 26 (fp32 master, m, v; bf16 grad read; bf16 copy-out into the model),
        torch fused 14 (bf16 param, m, v read and written; bf16 grad): no fp32 master, so updates
        below bf16's resolution are lost; the memory-bound lower bound is that much lower.
With --clip N, each step is what a user who clips runs: ours AdamW(max_grad_norm=N), which reads
the gradients once more for the norm (32 B/el in fp32); torch's clip_grad_norm_(params, N), which
reads them for the norm and then scales them in place, and its fused step (40 B/el).
With --fsdp2, the same pair steps a model under FSDP2's fully_shard(CPUOffloadPolicy()) on one
gloo rank (unpinned where there is no GPU to pin for): what a CPUOffloadPolicy user times.

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
        python3 bench/fused_bench.py --threads 1
"""

import argparse
import os
import statistics
import tempfile
import time

import torch

from machine import cpu_name, load, memory_settings


def flat(args, dtype):
    torch.manual_seed(0)
    params = []
    for _ in range(args.params):
        n = args.elements // args.params
        p = torch.nn.Parameter((torch.randn(n) * 0.02).to(dtype))
        p.grad = (torch.randn(n) * 1e-3).to(dtype)
        params.append(p)
    return params


def sharded_model(args, dtype):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))  # gloo's, also where CUDA would be the default
    count = max(1, args.params // 2) if args.params > 1 else 6  # a weight and a bias each
    width = max(1, round((args.elements / count) ** 0.5))
    layers = [torch.nn.Linear(width, width) for _ in range(count)]
    model = torch.nn.Sequential(*layers).to(dtype)
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in layers:
        fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    for p in model.parameters():
        p.grad = torch.distributed.tensor.distribute_tensor(
            torch.randn(p.shape, dtype=dtype) * 1e-3, p.device_mesh, p.placements)
    return list(model.parameters())


def optimizers(args, make):
    import zenflow_bind.optim as zt
    ours_params, torch_params = make(), make()
    ours = zt.AdamW(ours_params, lr=1e-4, weight_decay=0.01, worker=False, threads=args.threads,
                    max_grad_norm=args.clip)
    fused = torch.optim.AdamW(torch_params, lr=1e-4, weight_decay=0.01, fused=True)
    if args.clip:
        def clipped(opt=fused, params=torch_params, max_norm=args.clip):
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()
        return {"zenflow": ours.step, "torch fused": clipped}, ours_params
    return {"zenflow": ours.step, "torch fused": fused.step}, ours_params


def measure(args, opts):
    for step in opts.values():
        for _ in range(args.warmup):
            step()
    times = {name: [] for name in opts}
    for _ in range(args.rounds):
        for name, step in opts.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return times


def report(label, numel, times):
    ours, fused = times["zenflow"], times["torch fused"]
    ratios = [f / o for o, f in zip(ours, fused)]
    for name in ("zenflow", "torch fused"):
        med = statistics.median(times[name])
        print(f"{label:22} {name:12} {med * 1e3:9.2f} ms {numel / med / 1e9:8.3f} Gelem/s")
    print(f"{label:22} zenflow / torch fused: median {statistics.median(ratios):.3f}x "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--params", type=int, default=1,
                    help="how many tensors --elements is cut into")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=12,
                    help="steps of each before the rounds (ours chooses its prefetch in its first "
                         "ten large steps: zenflow-bench(1))")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="clip by the global norm: max_grad_norm= against clip_grad_norm_")
    ap.add_argument("--fsdp2", action="store_true", help="under fully_shard(CPUOffloadPolicy())")
    args = ap.parse_args()
    if not 1 <= args.params <= args.elements:
        ap.error(f"--params {args.params}: from 1 to --elements ({args.elements})")
    torch.set_num_threads(args.threads)
    print(f"CPU {cpu_name()}, {os.cpu_count()} CPUs, affinity {sorted(os.sched_getaffinity(0))}; "
          f"torch {torch.__version__}; {args.threads} threads each; load average "
          f"{load()}")
    print(f"memory: {memory_settings()}")
    if args.fsdp2:
        import torch.distributed as dist
        store = dist.FileStore(tempfile.mktemp(prefix="fused-bench-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    for name in args.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        if args.fsdp2 and dtype != torch.float32:
            print(f"fsdp2 offload {name}: skipped (gloo, the CPU backend, cannot send {name})")
            continue
        make = (lambda: sharded_model(args, dtype)) if args.fsdp2 else (lambda: flat(args, dtype))
        opts, params = optimizers(args, make)
        numel = sum(p.numel() for p in params)
        label = ("fsdp2 offload " if args.fsdp2 else "flat ") + name + \
            (f" x{len(params)}" if len(params) > 1 else "")
        report(label + (f" clip {args.clip:g}" if args.clip else ""), numel, measure(args, opts))
        del opts, params
    if args.fsdp2:
        torch.distributed.destroy_process_group()
    print(f"load average at the end {load()}")


if __name__ == "__main__":
    main()
