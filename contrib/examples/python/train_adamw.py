#!/usr/bin/python3
"""A small Transformer trained with zenflow_bind.optim.AdamW, a drop-in for torch.optim.AdamW whose
step runs in a pinned zenflow-optimizer worker, with a cosine lr schedule and, with --overlap,
ZenFlow's overlap (each update lands one step later).

How to run it: README.md beside it.
"""

import argparse

import torch

import zenflow_bind.optim


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--overlap", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=128, dropout=0.0)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = zenflow_bind.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                    {"params": no_decay, "weight_decay": 0.0}],
                                   lr=1e-3, overlap=args.overlap, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    src = torch.randn(10, 16, 64)
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(src, src), src)  # learn the identity
        loss.backward()
        opt.step()
        sched.step()
        if step % 20 == 0 or step == 1:
            # with --overlap the norm is the previous step's (None before the first lands)
            norm = "-" if opt.last_grad_norm is None else f"{opt.last_grad_norm:.3f}"
            print(f"step {step:4d}  loss {loss.item():.5f}  grad norm {norm}  "
                  f"lr {sched.get_last_lr()[0]:.2e}")
    opt.synchronize()
    mem = opt.worker.memory()
    print(f"worker pid {opt.worker.pid}, {mem['numel']} parameters, "
          f"{mem['bytes_per_param']:.0f} bytes/param in the worker's layout")
    opt.close()


if __name__ == "__main__":
    main()
