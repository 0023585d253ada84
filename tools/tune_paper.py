"""Search the two paper recipes with ``hyperparallel tune`` and keep its JSON (docs/results.md's "Finding the
best schedule" section is rendered from it by ``tools/doc_numbers.py``).

    python tools/tune_paper.py            # run both searches, print time and counts
    python tools/tune_paper.py --write    # ... and write docs/tune_paper_8dev.json, docs/tune_paper_512dev.json

Each search is one ``hyperparallel tune RECIPE --json`` process; ``seconds`` in its JSON is the search's own
time (the wall time of the process, start-up and loading included, is printed too). The target is under
60 s per recipe on this project's 2-core machine. Not a test: timings depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = (("recipes/paper_8dev_qwen_vit.yaml", "docs/tune_paper_8dev.json"),
        ("recipes/paper_512dev_deepseek_vit.yaml", "docs/tune_paper_512dev.json"))


def write_json(out: str, d: dict) -> None:
    """Keep ``d`` as ``out`` (relative to the repository), as docs/results.md's blocks read it."""
    with open(os.path.join(ROOT, out), "w") as f:
        json.dump(d, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


def tune(recipe: str, top: int) -> tuple:
    cmd = [sys.executable, "-m", "hyperparallel", "tune", recipe, "--top", str(top), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write docs/tune_paper_*.json")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args(argv)
    slow = False
    for recipe, out in RUNS:
        d, wall = tune(recipe, args.top)
        d["command"] = f"hyperparallel tune {recipe} --top {args.top} --json"
        d["wall_s"] = round(wall, 1)
        d["os_load_avg"] = round(os.getloadavg()[0], 2)
        c, first = d["counts"], d["candidates"][0]
        slow = slow or wall >= 60
        print(f"{recipe}: {d['seconds']:.1f} s search, {wall:.1f} s wall (load {d['os_load_avg']}); searched "
              f"{c['searched']}, derived {c['derived']}, not derived {c['time_bound']} (time bound) + "
              f"{c['memory_bound']} (memory bound); rank 1 {first['schedule']} V={first['V']} M={first['M']} "
              f"{first['step_ms']:.0f} ms")
        if args.write:
            write_json(out, d)
    print("target < 60 s per recipe: " + ("SLOW" if slow else "OK"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
