"""Compare two logs of the same train_gpt.py command: the first step whose loss differs, and
whether the final weights are bit-identical (params_sha256). Used by bench/gpu_run.sh repeat."""

import json
import sys


def load(path):
    steps, segment = {}, None
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("segment"):
                segment = r
            else:
                steps[r["step"]] = r["loss"]
    return steps, segment


def main(name, a, b):
    (la, sa), (lb, sb) = load(a), load(b)
    if sa is None or sb is None:
        print(f"{name}: a run did not finish ({a}, {b})")
        return 1
    first = next((k for k in sorted(la) if la[k] != lb.get(k)), None)
    same = sa["params_sha256"] == sb["params_sha256"]
    where = "every step's loss equal" if first is None else (
        f"loss first differs at step {first}: {la[first]!r} against {lb.get(first)!r}")
    print(f"{name}: {where}; final weights {'bit-identical' if same else 'DIFFER'}"
          f" ({sa['params_sha256'][:12]} / {sb['params_sha256'][:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
