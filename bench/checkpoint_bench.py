#!/usr/bin/python3
"""A checkpoint of the optimizer and its resume: zenflow_bind.optim.AdamW, whose Adam moments live
in its worker, against torch.optim.AdamW(fused=True), whose moments are in the process, alternated
in one process. Prints figures and ratios; not a test.

Each round steps both (so that ours has state to bring out of its worker), then times, for each:
  save   torch.save(opt.state_dict(), FILE): ours brings the moments out of the worker first
  load   opt.load_state_dict(torch.load(FILE)): ours sends them back into the worker
FILE is in --dir (default /dev/shm: memory, so the figures are the optimizer's and not a disk's).
The model is --params fp32 parameters of --elements elements in all; the table gives medians over
--rounds rounds and the median of the per-round ratios (torch's time over ours: above 1, ours is
faster). torch.save writes 8 bytes per element of moments either way.

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
        python3 bench/checkpoint_bench.py --elements 50000000
"""

import argparse
import os
import statistics
import tempfile
import time

import torch

from machine import cpu_name, load, memory_settings


def model(args):
    torch.manual_seed(0)
    n = args.elements // args.params
    return [torch.nn.Parameter(torch.randn(n) * 0.02) for _ in range(args.params)]


def step(opt, params):
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()


def timed(call):
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=50_000_000)
    ap.add_argument("--params", type=int, default=12)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args()
    if not 1 <= args.params <= args.elements:
        ap.error(f"--params {args.params}: from 1 to --elements ({args.elements})")
    import zenflow_bind.optim as zt
    torch.set_num_threads(args.threads)
    print(f"CPU {cpu_name()}, {os.cpu_count()} CPUs, affinity {sorted(os.sched_getaffinity(0))}; "
          f"torch {torch.__version__}; {args.threads} threads each; load average {load()}")
    print(f"memory: {memory_settings()}")
    ours_params, torch_params = model(args), model(args)
    opts = {"zenflow": (zt.AdamW(ours_params, lr=1e-4, threads=args.threads), ours_params),
            "torch fused": (torch.optim.AdamW(torch_params, lr=1e-4, fused=True), torch_params)}
    times = {(name, what): [] for name in opts for what in ("save", "load")}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "optim.pt")
        for _ in range(args.rounds + 1):  # the first round warms up
            for name, (opt, params) in opts.items():
                step(opt, params)
                save = timed(lambda: torch.save(opt.state_dict(), path))
                loaded = timed(lambda: opt.load_state_dict(torch.load(path)))
                times[(name, "save")].append(save)
                times[(name, "load")].append(loaded)
    opts["zenflow"][0].close()
    numel = sum(p.numel() for p in ours_params)
    for what in ("save", "load"):
        ours, fused = times[("zenflow", what)][1:], times[("torch fused", what)][1:]
        for name, t in (("zenflow", ours), ("torch fused", fused)):
            med = statistics.median(t)
            print(f"{what:5} {numel / 1e6:7.1f}M fp32  {name:12} {med * 1e3:9.1f} ms "
                  f"{8 * numel / med / 1e9:7.2f} GB/s of moments")
        ratios = [f / o for o, f in zip(ours, fused)]
        print(f"{what:5} zenflow / torch fused speed: median {statistics.median(ratios):.3f}x "
              f"(rounds {min(ratios):.3f}-{max(ratios):.3f}x)")
    print(f"load average at the end {load()}")


if __name__ == "__main__":
    main()
