#!/usr/bin/python3
"""Data-parallel training with one srun task per rank: DistributedDataParallel, its gradients
averaged over gloo (CPU) or NCCL (one GPU per task), and zenflow_bind.optim.AdamW stepping each
rank's copy in the worker on the task's optimizer CPUs, each bucket of DDP's averages as soon as
DDP has reduced it, while backward goes on (register_ddp() and step_during_backward()).

    srun -n4 -c8 --zenflow-bind python3 train_ddp.py [--steps N] [--optimizer zenflow|torch]

The rank and the number of ranks come from Slurm (SLURM_PROCID, SLURM_NTASKS); the ranks meet at
MASTER_ADDR:MASTER_PORT (127.0.0.1:29500 unless set: on several nodes, export MASTER_ADDR as the
first node's address). Each rank trains on its own batches; the last line of each rank is a
checksum of its parameters, the same on every rank (DDP keeps them equal), and the same as
`--optimizer torch` gives, to float32 rounding.
"""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", choices=("zenflow", "torch"), default="zenflow")
    args = ap.parse_args()

    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("USE_LIBUV", "0")  # (Debian's torch 2.x is built without libuv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("SLURM_LOCALID", 0))) if gpu else "cpu"
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)

    torch.manual_seed(0)  # the same initial model on every rank
    net = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.GELU(),
                              torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU(),
                              torch.nn.Linear(args.hidden, 1)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device] if gpu else None)
    if args.optimizer == "zenflow":
        import zenflow_bind.optim
        opt = zenflow_bind.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                                       bucket_elements=1 << 14)
        opt.register_ddp(model)
        cpus = sorted({cpu for _, cpu in opt.worker.threads()})
        print(f"rank {rank}: ZENFLOW_OPT_CPUS={os.environ.get('ZENFLOW_OPT_CPUS')} worker "
              f"threads on {cpus}", flush=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    target = torch.nn.Linear(32, 1).to(device)  # the function to learn (the same everywhere)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 32, generator=data).to(device)
        with torch.no_grad():
            y = target(x)
        opt.zero_grad()
        during = opt.step_during_backward() if args.optimizer == "zenflow" else \
            contextlib.nullcontext()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with during:
            loss.backward()
        opt.step()
        if rank == 0 and (step == 1 or step % 10 == 0):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}: parameters sum {checksum!r}", flush=True)
    if args.optimizer == "zenflow":
        opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
