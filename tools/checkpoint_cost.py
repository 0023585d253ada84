"""Save time and size of the tiny MLLM's checkpoints, per format (docs/checkpoints.md's figures).

For each format it runs ``hyperparallel train recipes/tiny_mllm.yaml --steps S --save-every 1
--save-format F`` (2 CPU ranks, transpose) and reads rank 0's ``saved ... in T s`` log lines: the
time of a whole save as the training loop sees it (every rank's file, both barriers, the marker)
and the size of one step directory. Then it loads the newest step into the single-process
reference with MindSpore's own ``load_checkpoint`` / ``load_param_into_net`` (median of 5).
Saving is synchronous (MindSpore's ``async_save`` is not used).

    python tools/checkpoint_cost.py [--steps 8] [--out runs/checkpoint_cost] [--json docs/checkpoint_cost.json]

The JSON keeps the measurement; ``tools/doc_numbers.py`` renders docs/checkpoints.md's table from it (:func:`table`).
"""
import argparse
import json
import glob
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def run_format(fmt: str, steps: int, out: str):
    save, run = os.path.join(out, fmt, "ckpt"), os.path.join(out, fmt, "run")
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, "--steps", str(steps),
                        "--save-every", "1", "--save-format", fmt, "--save-dir", save, "--run-dir", run,
                        "--overwrite-save-dir"],   # a rerun into the same --out measures afresh
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{fmt}: training failed:\n{p.stderr[-2000:]}")
    with open(os.path.join(run, "logs", "worker_0.log"), errors="replace") as f:
        saves = [(int(m.group(1)), int(m.group(2)), float(m.group(3)))
                 for m in re.finditer(r"saved \S+ \((\d+) files, (\d+) bytes\) in ([\d.]+)s", f.read())]
    times = [t for _, _, t in saves[1:]]  # the first save also warms up the file system and MindSpore
    return save, saves[-1][0], saves[-1][1], statistics.median(times)


def load_time(save: str, fmt: str, repeats: int = 5) -> float:
    sys.path.insert(0, ROOT)
    import mindspore as ms
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE)
    rc = recipe.run
    ref = Reference(rc, recipe.micro_batch_num, {r.name: r.trainable for r in recipe.profile.regions})
    step = max(glob.glob(os.path.join(save, "step_*")), key=lambda d: int(d.rsplit("_", 1)[1]))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        params = {}
        for f in sorted(glob.glob(os.path.join(step, f"*.{fmt}"))):
            params.update(ms.load_checkpoint(f, format=fmt))
        for cell in (*ref.cells, ref.opt.opt):
            ms.load_param_into_net(cell, params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "checkpoint_cost"))
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "checkpoint_cost.json"))
    args = ap.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    rows = []
    for fmt in ("safetensors", "ckpt"):
        save, files, size, t = run_format(fmt, args.steps, args.out)
        rows.append({"format": fmt, "files": files, "bytes": size, "save_s": t, "load_s": load_time(save, fmt)})
    result = {"steps": args.steps, "command": "python tools/checkpoint_cost.py --steps %d" % args.steps,
              "os_load_avg": os.getloadavg()[0], "rows": rows}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"tiny MLLM (recipes/tiny_mllm.yaml), transpose on 2 CPU ranks, {args.steps} saves per format")
    print(table(result))
    return 0


def table(result: dict) -> str:
    """docs/checkpoints.md's Markdown table of a measurement."""
    out = ["| format | files per step | step directory | save (median) | load into the reference (median) |",
           "|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['format']} | {r['files']} | {r['bytes'] / 1024:.0f} KiB | {r['save_s'] * 1000:.1f} ms | "
                   f"{r['load_s'] * 1000:.1f} ms |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
