"""The runtime against a hand-written loop, side by side on real ranks.

    python tools/bare_loop.py recipes/bench_encoder_heavy.yaml --schedule 1f1b --schedule transpose \
        [--pairs 8] [--steps 6] [--warmup 2] [--set KEY=VALUE] [--out docs/bare_loop_2rank.json]

Per schedule, ``--pairs`` pairs of msrun launches, one launch at a time, alternating A B A B ...:
A runs the derived program through the runtime's interpreter, B the minimal hand-written loop of
the same schedule (``tools/bare_loop_worker.py``) over the same chunk Cells, data, communication,
tape autograd and optimizer. A step's time is the slowest rank's; the first ``--warmup`` steps of
every launch are dropped. Printed per schedule: both medians over all kept steps, the ratio
runtime / bare, and its spread over the pairs (each pair's ratio of launch medians: quartiles,
min, max). The losses of every step of every launch must be identical (bit for bit) between the
two, or the command exits 1: a faster loop that computes something else proves nothing.
``--in-process N`` adds N launches in which the two alternate step by step in one process (each with
its own Cells and optimizer): this VM's speed drifts by tens of percent between launches, and
seconds apart much less, so this ratio has the smaller spread.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hyperparallel.util import median, quantile  # noqa: E402
from hyperparallel.util import slug  # noqa: E402

WORKER = os.path.join(ROOT, "tools", "bare_loop_worker.py")
SCHEDULES = ("1f1b", "transpose")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe")
    p.add_argument("--schedule", action="append", default=None, choices=SCHEDULES,
                   help="schedule to compare (repeat; default both)")
    p.add_argument("--pairs", type=int, default=8, help="A/B launch pairs per schedule (default 8)")
    p.add_argument("--steps", type=int, default=6, help="measured steps per launch (default 6)")
    p.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of a launch (default 2)")
    p.add_argument("--in-process", type=int, default=4, metavar="N",
                   help="also N launches in which runtime and bare loop alternate step by step in one process "
                        "(drift of the machine cancels within seconds; default 4, 0: none)")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--out", default=None, metavar="FILE.json")
    p.add_argument("--run-dir", default=os.path.join("runs", "bare_loop"))
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    for flag, v, lo in (("--pairs", args.pairs, 1), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                        ("--in-process", args.in_process, 0)):
        if v < lo:
            p.error(f"{flag}: must be >= {lo}, got {v}")
    if args.out and not args.out.endswith(".json"):
        p.error(f"--out: must name a .json file, got {args.out!r}")
    return args


def plans(args):
    """(recipe, {schedule: plan}) checked before any launch; refuses what the bare loop cannot run."""
    from hyperparallel.recipe import checked_plan
    from hyperparallel.runconfig import load_parsed
    recipe = load_parsed(args.recipe, args.overrides)
    recipe.run   # the run config checked before launch
    out = {}
    for s in args.schedule or SCHEDULES:
        plan = checked_plan(recipe, s)
        if plan.data_parallel != 1 or len({c.index for c in plan.chunks if c.region == plan.regions()[-1]}) \
                != plan.num_devices:
            raise SystemExit(f"error: --schedule {s}: the bare loop runs D=1, one chunk of the last region per device")
        if s == "transpose" and plan.trainable.get(plan.regions()[0], True):
            raise SystemExit("error: --schedule transpose: the bare transpose loop needs a frozen encoder "
                             "(mpipe.profile.regions[0].trainable: false)")
        out[s] = plan
    return recipe, out


def launch_one(recipe, plan, schedule, mode, steps, out_dir, timeout, first="runtime"):
    """Per-rank results of one launch; with mode ``both`` a dict {"runtime": ranks, "bare": ranks}."""
    from hyperparallel.launch import launch
    job = {"mode": mode, "schedule": schedule, "device": recipe.raw.get("device", "CPU"), "raw": recipe.raw,
           "plan": plan.to_json(), "steps": steps, "out_dir": os.path.join(out_dir, "result"), "first": first}
    res = launch(job, plan.num_devices, os.path.join(out_dir, "logs"), timeout_s=timeout, echo=False, script=WORKER)
    if res.returncode != 0:
        raise SystemExit(f"error: {mode} {schedule} failed (exit {res.returncode}): {res.message}")

    def read(d):
        ranks = []
        for r in range(plan.num_devices):
            with open(os.path.join(d, f"rank_{r}.json")) as f:
                ranks.append(json.load(f))
        return ranks
    if mode == "both":
        return {m: read(os.path.join(job["out_dir"], m)) for m in ("runtime", "bare")}
    return read(job["out_dir"])


def step_times(ranks, warmup):
    """The slowest rank's time of every step after ``warmup``, leaving out steps in which some rank compiled a
    graph (``mpipe.compile: jit``: the first step of a new input shape is compile time, not step time)."""
    n = min(len(r["steps"]) for r in ranks)
    keep = [i for i in range(warmup, n) if not any(r["steps"][i].get("compiles") for r in ranks)] or \
        list(range(warmup, n))
    return [max(r["steps"][i]["step_s"] for r in ranks) for i in keep]


def losses(ranks):
    return [s["loss"] for s in ranks[0]["steps"]]


def summarize(schedule, rt, bare, pair_ratios):
    a, b = median([t for x in rt for t in x]), median([t for x in bare for t in x])
    return {"schedule": schedule, "runtime_median_ms": a * 1e3, "bare_median_ms": b * 1e3, "ratio": a / b,
            "pair_ratios": pair_ratios, "ratio_q25": quantile(pair_ratios, 0.25),
            "ratio_q75": quantile(pair_ratios, 0.75), "ratio_min": min(pair_ratios), "ratio_max": max(pair_ratios),
            "runtime_launch_medians_ms": [median(x) * 1e3 for x in rt],
            "bare_launch_medians_ms": [median(x) * 1e3 for x in bare], "losses_identical": True}


def line(r) -> str:
    return (f"`{r['schedule']}`: runtime {r['runtime_median_ms']:.1f} ms, bare loop {r['bare_median_ms']:.1f} ms, "
            f"runtime / bare {r['ratio']:.3f} (per pair: median {median(r['pair_ratios']):.3f}, "
            f"quartiles {r['ratio_q25']:.3f}-{r['ratio_q75']:.3f}, min {r['ratio_min']:.3f}, "
            f"max {r['ratio_max']:.3f}; {len(r['pair_ratios'])} pairs)")


def main(argv=None) -> int:
    args = parse(argv)
    recipe, plan_of = plans(args)
    run_dir = os.path.abspath(args.run_dir)
    rows, t0 = [], time.time()
    for s, plan in plan_of.items():
        rt, bare, ratios, ref = [], [], [], None
        for k in range(args.pairs):
            got = {}
            for mode in ("runtime", "bare"):
                ranks = launch_one(recipe, plan, s, mode, args.warmup + args.steps,
                                   os.path.join(run_dir, slug(s), f"p{k}_{mode}"), args.timeout)
                ls = losses(ranks)
                if ref is None:
                    ref = ls
                elif ls != ref:
                    print(f"error: {s}: {mode} launch {k + 1} losses {ls} differ from {ref}", file=sys.stderr)
                    return 1
                got[mode] = step_times(ranks, args.warmup)
            rt.append(got["runtime"])
            bare.append(got["bare"])
            ratios.append(median(got["runtime"]) / median(got["bare"]))
            print(f"[{s} pair {k + 1}/{args.pairs}] runtime {median(got['runtime']) * 1e3:.1f} ms, "
                  f"bare {median(got['bare']) * 1e3:.1f} ms, ratio {ratios[-1]:.3f}", flush=True)
        rows.append(summarize(s, rt, bare, ratios))
        rows[-1]["losses"] = ref
        if args.in_process:
            rt2, bare2, ratios2 = [], [], []
            for k in range(args.in_process):
                first = "runtime" if k % 2 == 0 else "bare"
                got = launch_one(recipe, plan, s, "both", args.warmup + args.steps,
                                 os.path.join(run_dir, slug(s), f"q{k}_both"), args.timeout, first)
                for mode in ("runtime", "bare"):
                    if losses(got[mode]) != ref:
                        print(f"error: {s}: {mode} (in-process launch {k + 1}) losses {losses(got[mode])} "
                              f"differ from {ref}", file=sys.stderr)
                        return 1
                rt2.append(step_times(got["runtime"], args.warmup))
                bare2.append(step_times(got["bare"], args.warmup))
                ratios2.append(median(rt2[-1]) / median(bare2[-1]))
                print(f"[{s} in-process {k + 1}/{args.in_process}] runtime {median(rt2[-1]) * 1e3:.1f} ms, "
                      f"bare {median(bare2[-1]) * 1e3:.1f} ms, ratio {ratios2[-1]:.3f}", flush=True)
            rows[-1]["in_process"] = summarize(s, rt2, bare2, ratios2)
    print()
    for r in rows:
        print(line(r))
        if "in_process" in r:
            print("  in one process, alternating steps: " + line(r["in_process"]))
    print(f"losses identical in every launch; {(2 * args.pairs + args.in_process) * len(rows)} launches in "
          f"{time.time() - t0:.0f} s")
    if args.out:
        cmd = "python tools/bare_loop.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as f:
            json.dump({"recipe": args.recipe, "command": cmd, "pairs": args.pairs, "steps": args.steps,
                       "warmup": args.warmup, "in_process_launches": args.in_process,
                       "ranks": next(iter(plan_of.values())).num_devices,
                       "overrides": args.overrides, "schedules": rows}, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
