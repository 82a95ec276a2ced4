#!/usr/bin/python3
"""step() with a parameter that has no gradient (torch's zero_grad() leaves None; a layer used
on some steps, an MoE expert nothing was routed to), against the same model with every gradient,
for zenflow_bind.optim.AdamW and torch.optim.AdamW alike, alternated in one process. torch leaves
such a parameter alone; so does ours, whose worker is told to leave its range idle. Prints
figures; not a test.

Model: a Linear of --width x --width and a 4x4 Linear that gets a gradient at the first step
only. Each round times --steps steps of each optimizer and case, in turns; the table gives the
median step() time over every round (after a warm-up step each).

    PYTHONPATH=python ZENFLOW_BIND_LIB=build/default/libzenbind/libzenbind.so.2 \\
        ZENFLOW_OPTIMIZER=build/default/optimizer/zenflow-optimizer python3 bench/idle_bench.py
"""

import argparse
import statistics
import time

import torch

from machine import cpu_name, load


def model(width):
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"big": torch.nn.Linear(width, width),
                                "small": torch.nn.Linear(4, 4)})


def times(make_opt, width, steps, small_once):
    m = model(width)
    opt = make_opt(m.parameters())
    x = torch.randn(8, width)
    out = []
    for i in range(steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = m["big"](x).sum()
        if i == 0 or not small_once:
            loss = loss + m["small"](torch.ones(1, 4)).sum()
        loss.backward()
        t = time.perf_counter()
        opt.step()
        if hasattr(opt, "synchronize"):
            opt.synchronize()
        if i:
            out.append(time.perf_counter() - t)
    if hasattr(opt, "close"):
        opt.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import zenflow_bind.optim
    optimizers = {"zenflow_bind.optim.AdamW": lambda p: zenflow_bind.optim.AdamW(p, lr=1e-3),
                  "torch.optim.AdamW()": lambda p: torch.optim.AdamW(p, lr=1e-3)}
    print(f"{cpu_name()}, load {load()}, torch {torch.__version__}, "
          f"{args.width * (args.width + 1) + 20} parameters, {torch.get_num_threads()} threads")
    got = {(name, once): [] for name in optimizers for once in (False, True)}
    for _ in range(args.rounds):
        for name, make in optimizers.items():
            for once in (False, True):
                got[(name, once)] += times(make, args.width, args.steps, once)
    print(f"{'step() ms, median':34} {'every gradient':>16} {'one layer without':>18}")
    for name in optimizers:
        every, without = (statistics.median(got[(name, o)]) * 1e3 for o in (False, True))
        print(f"{name:34} {every:16.1f} {without:18.1f}")


if __name__ == "__main__":
    main()
