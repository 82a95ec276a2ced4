#!/usr/bin/python3
"""A small regression model trained with its AdamW step in a zenflow-optimizer worker.

ZenFlow's overlap, in miniature: while the worker updates the parameters with the gradients of
step k (gradient buffer k % 2), this process computes the gradients of step k+1 into the other
buffer, with the model's weights of step k-1 (one step stale, as in ZenFlow). The worker's fp32
"stale" snapshot is copied back into the model after each wait.

How to run it: README.md beside it.
"""

import argparse

import torch

from zenflow_bind import Group, Worker


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.GELU(),
                                torch.nn.Linear(args.hidden, 1))
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    target = torch.nn.Linear(32, 1)  # the function to learn

    with Worker() as worker:
        group = worker.add_group(numel, grad="fp32", stale=True, lr=args.lr, weight_decay=1e-4)
        flat_params = Group.torch_view(group.params)
        flat_params.copy_(torch.cat([p.detach().reshape(-1) for p in params]))
        grads = [Group.torch_view(g) for g in group.grads]
        stale = Group.torch_view(group.stale)
        print(f"worker pid {worker.pid}, threads (tid, cpu) {worker.threads()}, "
              f"{numel} parameters, {worker.memory()['bytes_per_param']:.0f} bytes/param")

        in_flight = False
        for step in range(1, args.steps + 1):
            x = torch.randn(64, 32)
            with torch.no_grad():
                y = target(x)
            loss = torch.nn.functional.mse_loss(model(x), y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            k = step % 2  # buffer k is free: the worker reads the other one
            torch.cat([p.grad.reshape(-1) for p in params], out=grads[k])
            if in_flight:
                worker.wait()
                offset = 0
                with torch.no_grad():  # the weights the worker just produced
                    for p in params:
                        p.copy_(stale[offset:offset + p.numel()].view_as(p))
                        offset += p.numel()
            worker.submit(step, grad_buffer=k)
            in_flight = True
            if step % 50 == 0 or step == 1:
                print(f"step {step:4d}  loss {loss.item():.5f}")
        worker.wait()
        mem = worker.memory()
        print(f"RSS: trainer {mem['trainer_rss'] >> 20} MiB, worker {mem['worker_rss'] >> 20} MiB")


if __name__ == "__main__":
    main()
