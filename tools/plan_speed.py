"""Time derive + check + simulate of a large transpose plan (P=16, M=256, interleaved LLM with V=2).

Usage: python tools/plan_speed.py [--schedule S] [--repeat N]
Prints the best of N runs for each phase; the target is under 1 s in total on a 2-core machine.
Not a test: timings depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import time

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import simulate

PROFILE = {
    "link": {"latency_ms": 0.02, "bandwidth_gb_s": 50},
    "regions": [
        {"name": "vision", "layers": 32, "trainable": True, "forward_ms": 0.4, "backward_ms": 0.4, "weight_ms": 0.4,
         "activation_mb": 50.0, "output_mb": 20.0, "param_mb": 40.0},
        {"name": "llm", "layers": 64, "trainable": True, "forward_ms": 1.0, "backward_ms": 1.0, "weight_ms": 1.0,
         "activation_mb": 100.0, "output_mb": 20.0, "param_mb": 400.0},
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="transpose(order=interleaved)")
    ap.add_argument("--P", type=int, default=16)
    ap.add_argument("--M", type=int, default=256)
    ap.add_argument("--V", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    prof = parse_profile(PROFILE)
    best = {"derive": 1e9, "check": 1e9, "simulate": 1e9, "total": 1e9}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        plan = derive(prof, args.schedule, args.P, args.M, args.V)
        t1 = time.perf_counter()
        errs = check(plan)
        t2 = time.perf_counter()
        rep = simulate(plan, prof)
        t3 = time.perf_counter()
        assert errs == [], errs[:3]
        for k, v in (("derive", t1 - t0), ("check", t2 - t1), ("simulate", t3 - t2), ("total", t3 - t0)):
            best[k] = min(best[k], v)
    n = sum(len(p) for p in plan.programs.values())
    print(f"{args.schedule}: P={args.P} M={args.M} V={args.V}, {n} actions, step {rep.makespan_ms:.1f} ms "
          f"(best of {args.repeat})")
    for k, v in best.items():
        print(f"  {k:9s} {v * 1000:8.1f} ms")
    print("  target    < 1000 ms total: " + ("OK" if best["total"] < 1.0 else "SLOW"))


if __name__ == "__main__":
    main()
