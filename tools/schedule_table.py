"""Print the pipe orders side by side: step and peak activations from `simulate`.

Usage: python tools/schedule_table.py [--P 4] [--M 8] [--f 1] [--b 1] [--w 0.5] [--torch]

One LLM region, uniform chunks (per-chunk forward f, input-grad b, weight-grad w, one activation
unit per chunk forward), free communication: the setting of the published closed forms and of the
torch comparison in issues 11 and 23. Every order of the registry, V = 1 where the order needs it,
else 2. Peak activations are in chunk activations (one chunk of one micro-batch), held from the
forward's start to the end of its last backward task (W when split); for V = 2 a chunk is half a
V = 1 stage. ``--torch``: the zero-bubble orders on issue 23's shapes next to
``torch.distributed.pipelining``'s figures in the same setting. Prints Markdown tables (docs/schedules.md).
"""
from __future__ import annotations

import argparse

from hyperparallel.mpipe import SpecError, check, derive, parse_profile
from hyperparallel.mpipe.cost import simulate
from hyperparallel.mpipe.orders import ORDERS, placement

#: torch.distributed.pipelining (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble) per chunk
#: f=1 b=1 w=0.5, free communication, one unit per chunk activation: (P, M, V) -> (step, peak).
#: The first four are issue 23's; the M = 12, V = 3 (and zbv M = 12) ones restate torch's order rule
#: (warmup (V-1)*round + P-1-rank forwards, rank's W's one 1F1B step late; ZB-V's phases) in our model.
TORCH = {"interleaved_zb": {(4, 8, 2): (44.5, 8), (4, 12, 2): (64.5, 8), (2, 6, 3): (46.5, 6),
                            (4, 12, 3): (94.5, 12), (3, 12, 3): (93.0, 9), (2, 12, 3): (91.5, 6)},
         "zbv": {(4, 8, 2): (43.0, 8), (4, 12, 2): (63.0, 8), (3, 12, 2): (62.0, 6)}}


def figures(order: str, P: int, M: int, V: int, f: float, b: float, w: float):
    """(step, per-device peak activations) of ``order``; SpecError where (P, M, V) is refused."""
    prof = parse_profile({"regions": [{"name": "llm", "layers": P * V, "forward_ms": f, "backward_ms": b,
                                       "weight_ms": w, "activation_mb": 1.0}]})
    plan = derive(prof, order, P, M, V)
    assert check(plan) == [], order
    rep = simulate(plan, prof)
    return rep, [d.peak_activation_mb for d in rep.devices]


def orders_table(a) -> None:
    print(f"P={a.P} M={a.M}, per chunk f={a.f} b={a.b} w={a.w}, free communication")
    print("| order | V | placement | step | peak (chunks) | bubble | peak per device |")
    print("|---|---|---|---|---|---|---|")
    for order, o in ORDERS.items():
        V = o.V or 2
        try:
            rep, peaks = figures(order, a.P, a.M, V, a.f, a.b, a.w)
        except SpecError as e:
            print(f"| `{order}` | {V} | {placement(order)} | refused: {e} | | | |")
            continue
        per = ", ".join(f"{p:g}" for p in peaks)
        print(f"| `{order}` | {V} | {placement(order)} | {rep.makespan_ms:g} | {max(peaks):g} | "
              f"{rep.bubble_ratio:.3f} | {per} |")


def torch_table() -> None:
    print("per chunk f=1 b=1 w=0.5, free communication; torch: torch.distributed.pipelining")
    print("| order | P | M | V | step | peak (chunks) | torch step | torch peak |")
    print("|---|---|---|---|---|---|---|---|")
    for base, shapes in TORCH.items():
        for order in (base, f"{base}_fast"):
            for (P, M, V), (t_step, t_peak) in shapes.items():
                rep, peaks = figures(order, P, M, V, 1.0, 1.0, 0.5)
                print(f"| `{order}` | {P} | {M} | {V} | {rep.makespan_ms:g} | {max(peaks):g} | {t_step:g} | {t_peak} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=4)
    ap.add_argument("--M", type=int, default=8)
    ap.add_argument("--f", type=float, default=1.0)
    ap.add_argument("--b", type=float, default=1.0)
    ap.add_argument("--w", type=float, default=0.5)
    ap.add_argument("--torch", action="store_true", help="the zero-bubble orders on issue 23's shapes vs torch")
    a = ap.parse_args()
    torch_table() if a.torch else orders_table(a)


if __name__ == "__main__":
    main()
