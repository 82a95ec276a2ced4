#!/usr/bin/python3
"""Compare runs of train_gpt.py: one table on stdout, loss and step time per step in a PNG.

    report.py [--png demo.png] [--straight LOG] [--gpu-figures bench/README.md]
              [--resumed-in WHERE] "LABEL=LOG" ...

Each LOG is a --log file of train_gpt.py, possibly written by several segments (a run stopped at
its checkpoint and resumed). Per-step times are medians over the steps, leaving out each
segment's first (imports, worker start, first allocations). --straight is a run of one segment
whose final weights a resumed run of the same optimizer must equal; --gpu-figures quotes the GPU
measurements of bench/README.md where the first run loses on this machine; --resumed-in says
where a resumed segment ran (default "a new srun step"). Every figure comes from the logs and
files given."""

import argparse
import json
import statistics
import textwrap


def load(path):
    steps, segments = [], []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            (segments if record.get("segment") else steps).append(record)
    return steps, segments


def median(steps, key, first_steps):
    values = [s[key] for s in steps if s["step"] not in first_steps and s.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def joined(segments, key, fmt="{}"):
    """A value of each segment; once if they all agree."""
    values = list(dict.fromkeys(fmt.format(s[key]) for s in segments if key in s))
    return " | ".join(values) if values else "-"


def row(label, steps, segments):
    first = {s["first"] for s in segments}
    step_ms = median(steps, "step_ms", first)
    return [label,
            "%.0f" % (median(steps, "tokens", first) / step_ms * 1e3),
            "%.1f" % median(steps, "opt_ms", first),
            "%.1f" % step_ms,
            "%.0f%%" % (100 * median(steps, "opt_ms", first) / step_ms),
            "%.1f" % median(steps, "blocked_ms", first),
            "%.0f" % median(steps, "faults", first),
            "%.1f" % (sum(s["step_ms"] for s in steps) / 1e3),
            "%.4f" % segments[-1]["eval_loss"],
            joined(segments, "bytes_per_param", "{:.1f}"),
            "%s (%s)" % (joined(segments, "train_cpus"), joined(segments, "train_threads")),
            "%s (%s)" % (joined(segments, "opt_cpus"), joined(segments, "opt_threads"))]


HEADER = ["", "tokens/s", "optimizer step ms", "training step ms", "optimizer share of a step",
          "waiting for optimizer ms", "page faults per step", "total s",
          "final loss", "host B/param", "training CPUs (threads)", "optimizer CPUs (threads)"]


def print_table(rows):
    # transposed: one line per measure, one column per run, so long labels stay readable
    table = [[HEADER[i]] + [r[i] for r in rows] for i in range(len(HEADER))]
    width = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, width)).rstrip())


def running_mean(values, n):
    """Each value averaged with up to n - 1 before it: a loss of a few bytes a step is noisy."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


RESUMED_IN = "a new srun step"


def plot(path, runs, resumed_in=RESUMED_IN):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5))
    for label, steps, segments in runs:
        x = [s["step"] for s in steps]
        top.plot(x, running_mean([s["loss"] for s in steps], 10), label=label, linewidth=1.2)
        line, = bottom.plot(x, [s["step_ms"] for s in steps], label="whole step", linewidth=1.2)
        bottom.plot(x, [s["blocked_ms"] for s in steps], linestyle=":", linewidth=1.2,
                    color=line.get_color(), label="of which in optimizer step()")
    resumes = sorted({s["first"] for _, _, segs in runs for s in segs} - {1})
    for at in resumes:
        for ax in (top, bottom):
            ax.axvline(at - 0.5, color="grey", linestyle="--", linewidth=1)
        top.annotate(f"checkpoint; resumed in {resumed_in}", (at - 0.5, 1), xytext=(4, -12),
                     xycoords=("data", "axes fraction"), textcoords="offset points", fontsize=9,
                     color="dimgrey")
    top.set_ylabel("training loss (mean of 10 steps)")
    bottom.set_ylabel("time per training step (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    top.legend(loc="upper right", bbox_to_anchor=(1, 0.9), fontsize=9)
    bottom.legend(loc="center right", fontsize=8, ncol=2)
    top.set_title("GPT-2-style decoder on this machine: loss and step time per step")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def resume_check(runs, straight, resumed_in=RESUMED_IN):
    """Whether the resumed run of the straight run's optimizer ended with its weights."""
    _, [whole] = load(straight)
    for label, _, segments in runs:
        if segments[0]["optimizer"] == whole["optimizer"] and len(segments) > 1:
            same = segments[-1]["params_sha256"] == whole["params_sha256"]
            return (f"{label}: stopped after step {segments[0]['last']}, resumed from its DCP "
                    f"checkpoint in {resumed_in}; its final weights "
                    f"{'equal' if same else 'DIFFER FROM'} those of a run that never stopped "
                    f"(SHA-256 {segments[-1]['params_sha256'][:16]} against "
                    f"{whole['params_sha256'][:16]})"), same
    return f"no resumed {whole['optimizer']} run to compare with {straight}", False


def gpu_figures(path):
    """The H100 section of bench/README.md: its machine sentence and its table."""
    with open(path) as f:
        lines = f.read().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("### On an H100"))
    end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("- "))
    paragraphs = "\n".join(lines[at + 1:end]).strip().split("\n\n")
    return " ".join(paragraphs[0].split()), [line for line in lines[at:end] if line[:1] == "|"]


def verdict(runs, gpu_path):
    """Where the first run stands against the fastest other one, in this run's figures."""
    def step_ms(run):
        _, steps, segments = run
        return median(steps, "step_ms", {s["first"] for s in segments})
    ours, best = runs[0], min(runs[1:], key=step_ms)
    ratio = step_ms(ours) / step_ms(best)
    cpus = ours[2][0]["train_cpus"], ours[2][0]["opt_cpus"]
    print(f"\n{ours[0]}: {ratio:.2f}x the step time of {best[0]} on this machine "
          f"(training on CPUs {cpus[0]}, the optimizer on {cpus[1]}).")
    if ratio > 1 and gpu_path:
        machine, table = gpu_figures(gpu_path)
        print("Here training and the optimizer share the few cores this machine has, and giving "
              "torch all of them wins. The split wins where training runs on a GPU and the "
              f"optimizer on the cores beside it, as {gpu_path} measured:")
        print(textwrap.fill(machine, 99))
        print("\n".join(table))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", help="write the picture here")
    ap.add_argument("--straight", help="a run that never stopped, for the resume check")
    ap.add_argument("--gpu-figures", help="bench/README.md, quoted where the first run loses")
    ap.add_argument("--resumed-in", default=RESUMED_IN, help="where resumed segments ran")
    ap.add_argument("runs", nargs="+", metavar="LABEL=LOG")
    args = ap.parse_args()
    runs = []
    for spec in args.runs:
        label, _, path = spec.rpartition("=")  # labels may hold "=" (srun options)
        runs.append((label, *load(path)))
    print_table([row(*run) for run in runs])
    if args.straight:
        print("\n" + resume_check(runs, args.straight, args.resumed_in)[0])
    if len(runs) > 1:
        verdict(runs, args.gpu_figures)
    if args.png:
        try:
            plot(args.png, runs, args.resumed_in)
            print(f"\npicture: {args.png}")
        except ImportError as e:
            print(f"\nno picture: {e.name} is not installed here")


if __name__ == "__main__":
    main()
