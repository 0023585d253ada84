"""The loss curve of a run, from its ``metrics.jsonl``.

    python tools/loss_curve.py RUN_DIR                 # step, loss, lr, grad_norm table on stdout
    python tools/loss_curve.py RUN_DIR --png loss.png  # and a PNG: loss (left axis) and lr (right axis)

RUN_DIR may also be the ``metrics.jsonl`` file itself. Several RUN_DIRs draw one curve each (e.g. a
pipeline run and its ``--reference``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def read(path: str):
    f = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(f):
        raise SystemExit(f"error: {path}: no metrics.jsonl")
    with open(f) as fh:
        return [json.loads(ln) for ln in fh if ln.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--png", metavar="FILE.png")
    args = ap.parse_args(argv)
    runs = {r: read(r) for r in args.runs}
    for name, m in runs.items():
        print(f"# {name}")
        print("step  loss        lr          grad_norm")
        for r in m:
            print(f"{r['step']:<5d} {r['loss']:<11.6f} {r.get('lr', float('nan')):<11.4e} "
                  f"{r.get('grad_norm', float('nan')):.4f}")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        lr_ax = ax.twinx()
        for name, m in runs.items():
            steps = [r["step"] for r in m]
            ax.plot(steps, [r["loss"] for r in m], marker="o", ms=3, label=os.path.basename(name.rstrip("/")))
            if all("lr" in r for r in m):
                lr_ax.plot(steps, [r["lr"] for r in m], ls=":", color="grey")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        lr_ax.set_ylabel("learning rate (dotted)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
