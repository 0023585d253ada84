"""How long one 8-rank launch takes on this machine: the three layouts tests/integration/test_eight_ranks.py runs.

    python tools/eight_ranks.py [--out docs/eight_ranks.json] [--steps 3]

One msrun job of 8 CPU ranks runs P=8 transpose, P=8 1f1b and P=4 x D=2 transpose (3 steps each) as
cases of one launch, like the test; writes the launch's wall time (msrun start-up included), the
machine's cores and its load average before and after (``tools/doc_numbers.py`` renders docs/training.md's
sentence from the file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "eight_ranks.json"))
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    from hyperparallel.testing import EIGHT_RANKS as CASES, job_case   # the test's layouts: one source for both
    from hyperparallel.launch import launch
    tmp = tempfile.mkdtemp(prefix="hp_eight_")
    cases = [job_case(tmp, RECIPE, sched, name, list(ov) + [f"train.steps={args.steps}"], steps=args.steps)
             for name, (sched, ov) in CASES.items()]
    load0 = os.getloadavg()[0]
    t0 = time.time()
    res = launch({"cases": cases, "device": "CPU"}, 8, os.path.join(tmp, "log"), timeout_s=1800, echo=False)
    wall = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"the 8-rank launch failed: {res.message}")
    out = {"ranks": 8, "cases": list(CASES), "steps": args.steps, "wall_s": round(wall, 1),
           "cores": os.cpu_count(), "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
