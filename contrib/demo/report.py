#!/usr/bin/python3
"""Compare runs of train_transformer.py: one table on stdout, loss and step time per step in a PNG.

    report.py --png demo.png "LABEL=LOG" ["LABEL=LOG" ...]

Each LOG is a --log file of train_transformer.py, possibly written by several segments (a run
stopped at its checkpoint and resumed). Per-step times are medians over the steps, leaving out
each segment's first (imports, worker start, first allocations)."""

import argparse
import json
import statistics


def load(path):
    steps, segments = [], []
    for line in open(path):
        record = json.loads(line)
        (segments if record.get("segment") else steps).append(record)
    return steps, segments


def median(steps, key, first_steps):
    values = [s[key] for s in steps if s["step"] not in first_steps and s[key] is not None]
    return statistics.median(values) if values else float("nan")


def joined(segments, key, fmt="{}"):
    """A value of each segment; once if they all agree."""
    values = list(dict.fromkeys(fmt.format(s[key]) for s in segments if key in s))
    return " | ".join(values) if values else "-"


def row(label, steps, segments):
    first = {s["first"] for s in segments}
    return [label,
            "%.1f" % median(steps, "opt_ms", first),
            "%.1f" % median(steps, "step_ms", first),
            "%.1f" % median(steps, "blocked_ms", first),
            "%.1f" % (sum(s["step_ms"] for s in steps) / 1e3),
            "%.4f" % segments[-1]["eval_loss"],
            joined(segments, "bytes_per_param", "{:.1f}"),
            "%s (%s)" % (joined(segments, "train_cpus"), joined(segments, "train_threads")),
            "%s (%s)" % (joined(segments, "opt_cpus"), joined(segments, "opt_threads"))]


HEADER = ["", "optimizer step ms", "training step ms", "waiting for optimizer ms", "total s",
          "final loss", "B/param", "training CPUs (threads)", "optimizer CPUs (threads)"]


def print_table(rows):
    # transposed: one line per measure, one column per run, so long labels stay readable
    table = [[HEADER[i]] + [r[i] for r in rows] for i in range(len(HEADER))]
    width = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, width)).rstrip())


def plot(path, runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5))
    for label, steps, segments in runs:
        x = [s["step"] for s in steps]
        top.plot(x, [s["loss"] for s in steps], label=label, linewidth=1.2)
        line, = bottom.plot(x, [s["step_ms"] for s in steps], label="whole step", linewidth=1.2)
        bottom.plot(x, [s["blocked_ms"] for s in steps], linestyle=":", linewidth=1.2,
                    color=line.get_color(), label="of which in optimizer step()")
    resumes = sorted({s["first"] for _, _, segs in runs for s in segs} - {1})
    for at in resumes:
        for ax in (top, bottom):
            ax.axvline(at - 0.5, color="grey", linestyle="--", linewidth=1)
        top.annotate("checkpoint; resumed in a new srun step", (at - 0.5, 1), xytext=(4, -12),
                     xycoords=("data", "axes fraction"), textcoords="offset points", fontsize=9,
                     color="dimgrey")
    top.set_ylabel("training loss")
    bottom.set_ylabel("time per training step (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    top.legend(loc="upper right", bbox_to_anchor=(1, 0.9), fontsize=9)
    bottom.legend(loc="center right", fontsize=8, ncol=2)
    top.set_title("Small transformer on this machine: loss and step time per step")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", help="write the picture here")
    ap.add_argument("runs", nargs="+", metavar="LABEL=LOG")
    args = ap.parse_args()
    runs = []
    for spec in args.runs:
        label, _, path = spec.rpartition("=")  # labels may hold "=" (srun options)
        runs.append((label, *load(path)))
    print_table([row(*run) for run in runs])
    if args.png:
        plot(args.png, runs)
        print(f"\npicture: {args.png}")


if __name__ == "__main__":
    main()
