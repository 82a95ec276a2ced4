"""A trainer that saves a checkpoint when told to stop, as Slurm users write one: it trains with
zenflow_bind.optim.AdamW until SIGTERM (scancel, the time limit, preemption) or SIGUSR1 (sbatch
--signal) arrives, then saves the optimizer's state dict and its step count with torch.save and
exits 0. Slurm signals every process of the step, the optimizer worker too.

    checkpoint_on_signal.py CHECKPOINT [TIMEOUT_MS [WIDTH]]

TIMEOUT_MS is the optimizer's timeout_ms (default 600000), WIDTH that of its two square layers
(default 64; at 1024 most of the time goes to waiting for the worker's step). It prints
"training job=<SLURM_JOB_ID or ->" once it has stepped, and exits 3 if no signal came in two
minutes. Used by test_torch_failures.py and by tests/slurm/test_signals.py."""

import os
import signal
import sys
import time

import torch

import zenflow_bind.optim


STOP = []  # the signal that came, as the handler records it for the loop


def stop(signum, frame):
    STOP.append(signal.Signals(signum).name)


def main(path, timeout_ms=600_000, width=64):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 8))
    opt = zenflow_bind.optim.AdamW(model.parameters(), lr=1e-3, timeout_ms=timeout_ms)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, stop)
    steps, deadline = 0, time.monotonic() + 120
    while not STOP and time.monotonic() < deadline:
        opt.zero_grad()
        model(torch.randn(4, width)).square().mean().backward()
        opt.step()
        steps += 1
        if steps == 3:
            print(f"training job={os.environ.get('SLURM_JOB_ID', '-')}", flush=True)
    if not STOP:
        return 3
    torch.save({"optim": opt.state_dict(), "steps": steps, "signal": STOP[0]}, path)
    print(f"saved at step {steps} on {STOP[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:4])))
