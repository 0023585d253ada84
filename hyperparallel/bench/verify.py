"""``hyperparallel tune RECIPE --verify N``: the top N candidates, the recipe's own schedule and 1F1B in
one ``bench`` launch on the recipe's ranks, measured against the order the cost model predicted.

Every case is the candidate's own recipe (its M, micro-batch size, V, split: what ``--out`` writes)
and its checked plan; the launch steps them in rotation (:func:`hyperparallel.bench.ranks.measure.bench_rotation`,
as ``bench --rotate steps``), so all of them meet the same drift of the machine. The medians leave
out warm-up steps and steps disturbed by other processes as ``bench`` does. Predictions are the ones
``tune`` ranked by (the measured profiles, at each case's micro-batch size: a ``--profile`` measured
at the recipe's own size replaces the recipe's profile for the recipe's and 1F1B's cases too).
"""
from __future__ import annotations

import os
import sys
from typing import List, Tuple

from ..mpipe.cost import simulate
from ..recipe import checked_plan
from ..util import median, slug
from .bench import kept_steps, undisturbed
from .profile import BENCH_WORKER, read_ranks

MAX_CONTENTION = 0.1   # as bench's default --max-contention


def cases(space, outcome, n: int) -> List[dict]:
    """The cases of the launch: the top ``n`` of the table, the recipe's own schedule, 1F1B at the
    recipe's V and M (each once; a case the table already holds is marked, not repeated)."""
    out, seen = [], {}
    for i, s in enumerate(outcome.table[:n]):
        c = s.cand
        key = (s.name, c.V, c.M, c.layers)
        seen[key] = len(out)
        out.append({"name": f"#{i + 1} {s.name} V={c.V} M={c.M}", "schedule": s.name, "rank": i + 1, "V": c.V,
                    "M": c.M, "layers": list(c.layers), "predicted_ms": s.step_ms,
                    "recipe": space.recipe_for(c), "spec": space.schedule(c), "roles": ["candidate"]})
    rec = space.recipe
    for role, sched in (("recipe", None), ("1f1b", "1f1b")):
        plan = checked_plan(rec, sched)
        name = plan.meta["schedule_name"]
        layers = [ch.layers for ch in plan.chunks if ch.region == space.body.name]
        key = (name, space.V0, space.M0, tuple(layers))
        if key in seen:
            out[seen[key]]["roles"].append(role)
            continue
        spill = any(a.step for p in plan.programs.values() for a in p)
        seen[key] = len(out)
        out.append({"name": f"{role}: {name} V={space.V0} M={space.M0}", "schedule": name, "rank": None,
                    "V": space.V0, "M": space.M0, "layers": layers,
                    "predicted_ms": simulate(plan, space.profile_at(space.M0), steps=3 if spill else 1).step_ms,
                    "recipe": rec, "spec": sched, "roles": [role]})
    return out


def summarize(rows: List[dict]) -> dict:
    """Measured against predicted order: ranks, the rank-1 candidate against the fastest measured
    case and against 1F1B."""
    by_pred = sorted(rows, key=lambda r: r["predicted_ms"])
    by_meas = sorted(rows, key=lambda r: r["measured_ms"])
    for i, r in enumerate(by_pred):
        r["predicted_order"] = i + 1
    for i, r in enumerate(by_meas):
        r["measured_order"] = i + 1
        r["error"] = r["predicted_ms"] / r["measured_ms"] - 1.0
    first = next(r for r in rows if r["rank"] == 1)
    best = by_meas[0]
    base = next(r for r in rows if "1f1b" in r["roles"])
    own = next(r for r in rows if "recipe" in r["roles"])
    return {"cases": rows, "first": first["name"], "fastest_measured": best["name"],
            "first_vs_fastest": first["measured_ms"] / best["measured_ms"] - 1.0,
            "first_within_5pct": first["measured_ms"] <= 1.05 * best["measured_ms"],
            "first_vs_1f1b": base["measured_ms"] / first["measured_ms"],
            "first_faster_than_1f1b": first["measured_ms"] < base["measured_ms"],
            "first_vs_recipe": own["measured_ms"] / first["measured_ms"]}


def format_verify(v: dict) -> str:
    lines = [f"verify: one launch on {v['ranks']} {v['device']} ranks, {v['warmup']} warm-up + {v['steps']} measured "
             f"steps per case in rotation ({v['wall_s']:.0f} s)",
             "| case | predicted (ms) | measured (ms) | error | predicted order | measured order |",
             "|---|---|---|---|---|---|"]
    for r in v["cases"]:
        lines.append(f"| `{r['name']}` | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error'] * 100:+.1f}% | "
                     f"{r['predicted_order']} | {r['measured_order']} |")
    lines.append(f"rank 1 ({v['first']}) measured {v['first_vs_fastest'] * 100:+.1f}% against the fastest measured "
                 f"({v['fastest_measured']}): {'within' if v['first_within_5pct'] else 'NOT within'} 5%; "
                 f"{v['first_vs_1f1b']:.2f}x over 1F1B, {v['first_vs_recipe']:.2f}x over the recipe's own schedule")
    return "\n".join(lines)


def verify(args, space, outcome, n: int, launcher=None) -> Tuple[int, dict]:
    """Run the cases in one launch; returns (exit code, the verify JSON)."""
    import time

    from ..launch import preflight
    if launcher is None:
        from ..launch import launch as launcher
    rows = cases(space, outcome, n)
    rec = space.recipe
    world = rec.pipeline_stage * rec.data_parallel
    preflight(world, rec.device)
    from ..launch import refuse_tensor_parallel
    refuse_tensor_parallel(rec, "tune's verify")
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = os.path.abspath(args.run_dir or os.path.join("runs", slug(f"tune_{stem}")))
    jobs = []
    for i, r in enumerate(rows):
        rc = r["recipe"].run
        plan = checked_plan(r["recipe"], r["spec"])
        r["out_dir"] = os.path.join(run_dir, f"c{i}_{slug(r['schedule'])}", "result")
        jobs.append({"mode": "bench", "device": rc.device, "name": r["name"], "schedule": r["schedule"],
                     "raw": r["recipe"].raw, "plan": plan.to_json(), "data_parallel": plan.data_parallel,
                     "steps": args.warmup + args.steps, "out_dir": r["out_dir"], "action_times": False})
    job = {"mode": "rotation", "device": jobs[0]["device"], "data_parallel": rec.data_parallel, "profile": None,
           "cases": jobs}
    print(f"verify: {len(rows)} cases in one launch on {world} ranks, run dir {run_dir}", flush=True)
    t0, load0 = time.time(), os.getloadavg()[0]
    res = launcher(job, world, os.path.join(run_dir, "logs"), timeout_s=args.timeout, echo=False, script=BENCH_WORKER)
    if res.returncode != 0:
        print(f"error: verify launch failed (exit {res.returncode}): {res.message}", file=sys.stderr)
        return res.returncode, {"error": res.message}
    for r in rows:
        ranks = read_ranks(r.pop("out_dir"), world)
        steps = kept_steps(ranks, args.warmup)
        times, dropped, fell_back = undisturbed(steps, MAX_CONTENTION)
        r.update({"measured_ms": median(times) * 1e3, "samples": len(times), "dropped_disturbed": dropped,
                  "all_steps_kept_busy_machine": fell_back, "step_ms_all": [t * 1e3 for t, _ in steps]})
        del r["recipe"], r["spec"]
    out = summarize(rows)
    out.update({"ranks": world, "device": jobs[0]["device"], "warmup": args.warmup, "steps": args.steps,
                "wall_s": time.time() - t0, "max_contention": MAX_CONTENTION,
                "os_load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]})
    return 0, out
