"""Print the pipe orders side by side: step, bubble and peak activations from `simulate`.

Usage: python tools/schedule_table.py [--P 4] [--M 8] [--f 1] [--b 1] [--w 0.5]

One LLM region, uniform chunks (per-chunk forward f, input-grad b, weight-grad w), free
communication: the setting of the published closed forms and of the torch comparison in
issue 11. V = 1 for 1f1b/zb_h1, V = 2 for the others. Peak activations are in chunk
activations (one chunk of one micro-batch); for V = 2 a chunk is half a V = 1 stage.
Prints a Markdown table (the one in README's "Schedules" section).
"""
from __future__ import annotations

import argparse

from hyperparallel.mpipe import SpecError, check, derive, parse_profile
from hyperparallel.mpipe.cost import simulate
from hyperparallel.mpipe.orders import placement

ORDERS = [("1f1b", 1), ("zb_h1", 1), ("gpipe", 2), ("interleaved", 2), ("interleaved_zb", 2), ("zbv", 2),
          ("dualpipev", 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=4)
    ap.add_argument("--M", type=int, default=8)
    ap.add_argument("--f", type=float, default=1.0)
    ap.add_argument("--b", type=float, default=1.0)
    ap.add_argument("--w", type=float, default=0.5)
    a = ap.parse_args()
    print(f"P={a.P} M={a.M}, per chunk f={a.f} b={a.b} w={a.w}, free communication")
    print("| order | V | placement | step | bubble | peak activations per device (chunks) |")
    print("|---|---|---|---|---|---|")
    for order, V in ORDERS:
        prof = parse_profile({"regions": [{"name": "llm", "layers": a.P * V, "forward_ms": a.f,
                                           "backward_ms": a.b, "weight_ms": a.w, "activation_mb": 1.0}]})
        try:
            plan = derive(prof, order, a.P, a.M, V)
        except SpecError as e:
            print(f"| `{order}` | {V} | {placement(order)} | refused: {e} | | |")
            continue
        assert check(plan) == [], order
        rep = simulate(plan, prof)
        peaks = ", ".join(f"{d.peak_activation_mb:g}" for d in rep.devices)
        print(f"| `{order}` | {V} | {placement(order)} | {rep.makespan_ms:g} | {rep.bubble_ratio:.3f} | {peaks} |")


if __name__ == "__main__":
    main()
