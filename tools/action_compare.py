"""Which actions does the cost model under- or over-predict? Measured next to predicted, per action.

    HP_BENCH_ACTION_TIMES=1 hyperparallel bench RECIPE --schedule A ... --run-dir RUN
    python tools/action_compare.py RUN [--repeat K] [--warmup W]

Reads the bench run directory: the profile it measured (``RUN/profile.yaml``), the jobs of repeat K
(``RUN/r{K}_rotation/logs/job.json``, or the per-schedule launches of ``--rotate launches``) and every
rank's timed actions. For each schedule and each (rank, action kind, region, chunk): the measured time
per step (sum over the step's actions, mean over the kept steps) next to the cost model's (the same
plan executed with the measured profile), and the difference. Nothing is re-measured.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cases(run: str, repeat: int):
    """(name, plan JSON, result dir) of every timed schedule case of one repeat."""
    out = []
    paths = sorted(glob.glob(os.path.join(run, f"r{repeat}_*", "logs", "job.json")))
    for p in paths:
        with open(p) as f:
            job = json.load(f)
        for c in job.get("cases", [job]):
            if c.get("mode") == "bench" and c.get("action_times"):
                out.append((c["name"], c["plan"], c["out_dir"], c["raw"]))
    return out


def compare(run: str, repeat: int, warmup: int) -> str:
    import yaml
    from hyperparallel.mpipe.cost import simulate
    from hyperparallel.mpipe.ir import Plan
    from hyperparallel.mpipe.profile import parse_profile
    with open(os.path.join(run, "profile.yaml")) as f:
        profile = parse_profile(yaml.safe_load(f)["mpipe"]["profile"])
    lines = []
    for name, plan_json, out_dir, _ in cases(run, repeat):
        plan = Plan.from_json(plan_json)
        rep = simulate(plan, profile)
        pred = defaultdict(float)
        for d, tl in rep.execution.timeline.items():
            for t in tl:
                pred[(d, t.action.kind, t.action.region, t.action.chunk)] += t.end - t.start
        meas, steps = defaultdict(float), set()
        for path in sorted(glob.glob(os.path.join(out_dir, "rank_*.json"))):
            with open(path) as f:
                res = json.load(f)
            for a in res.get("action_times") or []:
                if a["step"] >= warmup:
                    steps.add(a["step"])
                    meas[(res["device"], a["kind"], a["region"], a["chunk"])] += a["ms"]
        n = max(1, len(steps))
        lines += [f"`{name}` (predicted step {rep.step_ms:.1f} ms)", "",
                  "| device | action | chunk | measured per step (ms) | predicted (ms) | predicted - measured |",
                  "|---|---|---|---|---|---|"]
        for k in sorted(set(meas) | set(pred)):
            m = meas.get(k, 0.0) / n
            p = pred.get(k, 0.0)
            lines.append(f"| {k[0]} | {k[1]} | {k[2]}/{k[3]} | {m:.1f} | {p:.1f} | {p - m:+.1f} |")
        lines.append("")
    if not lines:
        raise SystemExit(f"error: no timed actions under {run} repeat {repeat} "
                         f"(run the bench with HP_BENCH_ACTION_TIMES=1)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the bench's --run-dir")
    p.add_argument("--repeat", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args(argv)
    if not os.path.isfile(os.path.join(a.run, "profile.yaml")):
        p.error(f"run: {a.run} has no profile.yaml (a bench run that measured its profile)")
    print(compare(a.run, a.repeat, a.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
