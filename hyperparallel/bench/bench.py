"""``hyperparallel bench RECIPE --schedule A --schedule B ...``: schedules side by side on real ranks.

Each (repeat, schedule) is one msrun launch of the recipe's ranks running the derived
programs for ``warmup + steps`` optimizer steps; launches alternate A B A B ... so slow
drift of the machine hits every schedule alike. The first ``warmup`` steps of every launch
are discarded; a step's time is the slowest rank's (every step ends with a loss all-reduce,
so ranks agree to within it). Kept steps during which other processes used a rank's core
(the core's busy time in ``/proc/stat`` minus the rank's own CPU time; ranks are bound to one
core each) for more than ``--max-contention`` of the step are dropped and counted: on a
shared machine they measure the neighbours, not the schedule (with fewer than 3 undisturbed
steps all are kept, with a warning). Per schedule the table gives the median step time over all
kept steps of all repeats, the ratio ``median(first schedule) / median(this)`` (> 1: faster
than the first), the cost model's step time predicted from the recipe's profile (or
``--profile FILE``, e.g. written by ``hyperparallel profile``) and the prediction error
``predicted / measured - 1``; per rank the peak resident memory next to the cost model's
peak memory; and the share of the step spent in the interpreter itself (everything that is
not MindSpore compute, communication, data generation or the optimizer).
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

from ..mpipe.errors import PlanError, SpecError
from .common import error, slug
from .profile import BENCH_WORKER


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run schedules side by side on real ranks (msrun) against the cost model")
    p.add_argument("recipe", help="recipe YAML with model:, data:, train: and mpipe: sections")
    p.add_argument("--schedule", action="append", default=None, metavar="S",
                   help="schedule to run; repeat to compare (the first is the baseline of the ratio)")
    p.add_argument("--steps", type=int, default=6, help="measured steps per launch (default 6)")
    p.add_argument("--warmup", type=int, default=2, help="steps discarded at the start of every launch (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="launches per schedule, alternating schedules (default 3)")
    p.add_argument("--max-contention", type=float, default=0.1, metavar="FRAC",
                   help="drop kept steps during which other processes used a rank's core for more than FRAC "
                        "of the step (default 0.1; 1 keeps every step)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. mpipe.profile.regions.0.trainable=true")
    p.add_argument("--profile", default=None, metavar="FILE.yaml",
                   help="take mpipe.profile from this file (e.g. written by hyperparallel profile) for the prediction")
    p.add_argument("--measure-profile", action="store_true",
                   help="measure the profile in this run: one hyperparallel-profile launch per repeat, "
                        "alternating with the schedules (same drift), median over the launches")
    p.add_argument("--profile-schedule", default=None, metavar="S",
                   help="with --measure-profile: take the F/B/W costs in a pipeline context, from a real run of "
                        "reference schedule S (e.g. gpipe) with every action timed, one per repeat after the "
                        "profile launch (see hyperparallel profile --in-pipeline)")
    p.add_argument("--save-profile", default=None, metavar="FILE.yaml",
                   help="with --measure-profile: also write the measured profile here")
    p.add_argument("--out", default=None, metavar="FILE.json", help="write the results as JSON")
    p.add_argument("--png", default=None, metavar="FILE.png", help="draw a bar chart (measured vs predicted)")
    p.add_argument("--run-dir", default=None, help="logs and raw per-rank results (default runs/bench_<recipe>)")
    p.add_argument("--timeout", type=float, default=900, help="stop one launch after this many seconds")
    p.set_defaults(func=run)


# -- pure orchestration (unit-tested) ---------------------------------------------------------

def run_order(n_schedules: int, repeats: int) -> List[tuple]:
    """(repeat, schedule index) in launch order: A B C A B C ... (alternating across repeats)."""
    return [(r, i) for r in range(repeats) for i in range(n_schedules)]


def median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    if not v:
        raise ValueError("median of no values")
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    v = sorted(xs)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def kept_steps(ranks: List[dict], warmup: int) -> List[tuple]:
    """Per kept step (index >= warmup): (the slowest rank's step time in seconds, contention:
    the largest share of the step during which another process used a rank's core)."""
    by_step: Dict[int, list] = {}
    for res in ranks:
        for s in res["steps"]:
            if s["step"] >= warmup:
                cur = by_step.setdefault(s["step"], [0.0, 0.0])
                cur[0] = max(cur[0], s["step_s"])
                cur[1] = max(cur[1], s.get("foreign_cpu_s", 0.0) / s["step_s"] if s["step_s"] > 0 else 0.0)
    return [tuple(by_step[k]) for k in sorted(by_step)]


def kept_step_times(ranks: List[dict], warmup: int) -> List[float]:
    """Per kept step (index >= warmup), the slowest rank's step time in seconds."""
    return [t for t, _ in kept_steps(ranks, warmup)]


def undisturbed(steps: List[tuple], max_contention: float, at_least: int = 3) -> tuple:
    """(step times of the steps with contention <= max_contention, number dropped, fell_back):
    with fewer than ``at_least`` such steps every step is kept and fell_back is True."""
    clean = [t for t, c in steps if c <= max_contention]
    if len(clean) >= min(at_least, len(steps)):
        return clean, len(steps) - len(clean), False
    return [t for t, _ in steps], 0, True


def breakdown(ranks: List[dict], warmup: int) -> List[dict]:
    """Per rank: shares of the step (kept steps) and the interpreter's own time per action."""
    out = []
    for res in sorted(ranks, key=lambda r: r["rank"]):
        kept = [s for s in res["steps"] if s["step"] >= warmup]
        tot = sum(s["step_s"] for s in kept) or 1.0
        share = {k: sum(s[k + "_s"] for s in kept) / tot
                 for k in ("compute", "accumulate", "comm", "data", "optimizer", "loss_reduce", "interp")}
        per_action = sum(s["interp_s"] for s in kept) / max(1, len(kept) * res["n_actions"])
        out.append({"rank": res["rank"], "share": share, "interp_us_per_action": per_action * 1e6,
                    "n_actions": res["n_actions"], "base_rss_mb": res["base_rss_mb"],
                    "peak_rss_mb": res["peak_rss_mb"]})
    return out


def summarize(names: List[str], samples: Dict[str, List[float]],
              predicted: Dict[str, Optional[float]]) -> List[dict]:
    """Table rows: median, ratio against the first schedule, prediction and its error."""
    rows = []
    base = median(samples[names[0]])
    for n in names:
        med = median(samples[n])
        pred = predicted.get(n)
        rows.append({"schedule": n, "median_step_s": med, "ratio": base / med,
                     "predicted_step_s": pred,
                     "error": None if pred is None else pred / med - 1.0,
                     "min_step_s": min(samples[n]), "max_step_s": max(samples[n]),
                     "q25_step_s": quantile(samples[n], 0.25), "q75_step_s": quantile(samples[n], 0.75),
                     "samples": len(samples[n])})
    return rows


def format_table(rows: List[dict]) -> str:
    lines = ["| schedule | median step (ms) | ratio vs first | predicted (ms) | error |",
             "|---|---|---|---|---|"]
    for r in rows:
        pred = "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s'] * 1e3:.1f}"
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        lines.append(f"| `{r['schedule']}` | {r['median_step_s'] * 1e3:.1f} | {r['ratio']:.2f}x | {pred} | {err} |")
    return "\n".join(lines)


def format_memory(rows: List[dict]) -> str:
    lines = ["| schedule | rank | peak RSS (MB) | RSS at start (MB) | growth (MB) | predicted peak (MB) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        for d in r["ranks"]:
            pred = d.get("predicted_peak_mb")
            lines.append(f"| `{r['schedule']}` | {d['rank']} | {d['peak_rss_mb']:.0f} | {d['base_rss_mb']:.0f} | "
                         f"{d['peak_rss_mb'] - d['base_rss_mb']:.1f} | "
                         f"{'-' if pred is None else f'{pred:.2f}'} |")
    return "\n".join(lines)


def format_overhead(rows: List[dict]) -> str:
    lines = ["| schedule | rank | compute | grad accumulation | comm (incl. waiting) | data | optimizer | "
             "interpreter | interpreter per action (us) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for d in r["ranks"]:
            s = d["share"]
            lines.append(f"| `{r['schedule']}` | {d['rank']} | {s['compute']:.1%} | {s['accumulate']:.1%} | "
                         f"{s['comm']:.1%} | "
                         f"{s['data']:.1%} | {s['optimizer']:.1%} | {s['interp']:.2%} | "
                         f"{d['interp_us_per_action']:.0f} |")
    return "\n".join(lines)


# -- recipe, plans, prediction --------------------------------------------------------------

def load_with_profile(path: str, overrides: List[str], profile_path: Optional[str]):
    """The recipe, with ``mpipe.profile`` taken from ``profile_path`` when given (then ``--set``)."""
    from ..mpipe.recipe import load_raw, load_recipe, recipe_from_dict
    if not profile_path:
        return load_recipe(path, overrides)
    if not os.path.isfile(profile_path):
        raise SpecError("--profile", f"file not found: {profile_path}")
    prof_raw, _ = load_raw(profile_path)
    prof = (prof_raw.get("mpipe") or {}).get("profile") if isinstance(prof_raw, dict) else None
    if not isinstance(prof, dict):
        raise SpecError("--profile", f"{profile_path} has no mpipe.profile mapping")
    raw, loader = load_raw(path)
    if not isinstance(raw.get("mpipe"), dict):
        raise SpecError("mpipe", "missing; add an mpipe: section")
    raw["mpipe"]["profile"] = copy.deepcopy(prof)
    recipe = recipe_from_dict(raw, path=path, overrides=overrides)
    recipe.loader = loader
    return recipe


def prepare(args):
    """Everything checked before launch. Returns (recipe, run config, [(name, plan)]); with
    ``--profile-schedule`` the list ends with ``(None, reference plan)`` (profiled, not compared)."""
    from ..mindspore.config import run_config_of
    from ..mpipe.check import assert_valid
    from ..mpipe.derive import derive_recipe
    from ..launch import msrun_overrides

    for flag, v, lo in (("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0)):
        if v < lo:
            raise SpecError(flag, f"must be >= {lo}, got {v}")
    if not 0 < args.max_contention <= 1:
        raise SpecError("--max-contention", f"must be in (0, 1], got {args.max_contention}")
    for flag, path, ext in (("--out", args.out, ".json"), ("--png", args.png, ".png")):
        if path is None:
            continue
        if not path.endswith(ext):
            raise SpecError(flag, f"must name a {ext} file, got {path!r}")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise SpecError(flag, f"folder does not exist: {d}")
    if args.measure_profile and args.profile:
        raise SpecError("--measure-profile", "give either --profile FILE or --measure-profile")
    if getattr(args, "profile_schedule", None) and not args.measure_profile:
        raise SpecError("--profile-schedule", "needs --measure-profile")
    if args.save_profile and not args.measure_profile:
        raise SpecError("--save-profile", "needs --measure-profile")
    if args.save_profile and not os.path.isdir(os.path.dirname(os.path.abspath(args.save_profile))):
        raise SpecError("--save-profile", f"folder does not exist: {os.path.dirname(os.path.abspath(args.save_profile))}")
    recipe = load_with_profile(args.recipe, args.overrides, args.profile)
    rc = run_config_of(recipe)
    scheds = args.schedule or [recipe.schedule if isinstance(recipe.schedule, str) else json.dumps(recipe.schedule)]
    if len(set(scheds)) != len(scheds):
        raise SpecError("--schedule", "each schedule once (repeats come from --repeats)")
    plans = []
    for s in scheds:
        plans.append((s, assert_valid(derive_recipe(recipe, s))))
    if getattr(args, "profile_schedule", None):
        ref = assert_valid(derive_recipe(recipe, args.profile_schedule))
        if ref.num_devices * ref.data_parallel != plans[0][1].num_devices * plans[0][1].data_parallel:
            raise SpecError("--profile-schedule", f"{args.profile_schedule} needs a different number of ranks")
        plans.append((None, ref))  # the reference: profiled, not compared (see run)
    world = plans[0][1].num_devices * plans[0][1].data_parallel
    if args.measure_profile and world < 2:
        raise SpecError("--measure-profile", "needs >= 2 ranks (the link is measured between two)")
    msrun_overrides(world)
    return recipe, rc, plans


def predict(recipe, plan) -> dict:
    from ..mpipe.cost import simulate
    # next-step spill: the steady state is the last of 3 steps (as hyperparallel simulate does)
    rep = simulate(plan, recipe.profile, steps=3 if any(a.step for p in plan.programs.values() for a in p) else 1)
    return {"step_s": rep.step_ms / 1e3,
            "peak_mb": {d.device: d.peak_memory_mb for d in rep.devices}}


# -- the command ------------------------------------------------------------------------------

def run(args, launcher=None) -> int:
    """``launcher``: stands in for :func:`hyperparallel.launch.launch` (tests)."""
    try:
        recipe, rc, plans = prepare(args)
    except (SpecError, PlanError) as e:
        return error(str(e).splitlines()[0])
    ref_plan = plans.pop()[1] if plans[-1][0] is None else None
    names = [n for n, _ in plans]
    world = plans[0][1].num_devices * plans[0][1].data_parallel
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = os.path.abspath(args.run_dir or os.path.join("runs", slug(f"bench_{stem}")))
    order = run_order(len(plans), args.repeats)
    print(f"bench {stem}: {len(names)} schedules x {args.repeats} repeats (alternating), "
          f"{args.warmup} warm-up + {args.steps} measured steps each, on {world} {rc.device} ranks; "
          f"run dir {run_dir}", flush=True)
    if launcher is None:
        from ..launch import launch as launcher
    steps_of: Dict[str, List[tuple]] = {n: [] for n in names}
    per_rank: Dict[str, List[List[dict]]] = {n: [] for n in names}
    t_start = time.time()
    if args.measure_profile:  # one profile launch at the head of every round: P A B P A B ...
        order = [x for rep in range(args.repeats) for x in [(rep, -1)] + [(rep, i) for i in range(len(plans))]]
    rounds: List[List[dict]] = []
    ref_launches: List[List[dict]] = []
    for k, (rep, i) in enumerate(order):
        if i < 0:
            from .profile import profile_job, read_ranks
            tag = f"r{rep}_profile"
            job = profile_job(recipe, rc, plans[0][1], 8, 1, os.path.join(run_dir, tag, "result"))
            res = launcher(job, world, os.path.join(run_dir, tag, "logs"), timeout_s=args.timeout, echo=False,
                           script=BENCH_WORKER)
            if res.returncode != 0:
                print(f"error: profile (repeat {rep + 1}) failed (exit {res.returncode}): {res.message}",
                      file=sys.stderr)
                return res.returncode
            rounds.append(read_ranks(job["out_dir"], world))
            print(f"[{k + 1}/{len(order)}] profile repeat {rep + 1} ({res.wall_s:.0f} s launch)", flush=True)
            if ref_plan is not None:
                from .profile import reference_job
                tag = f"r{rep}_reference_{slug(args.profile_schedule)}"
                job = reference_job(recipe, rc, ref_plan, args.profile_schedule, args.warmup + args.steps,
                                    os.path.join(run_dir, tag, "result"))
                res = launcher(job, world, os.path.join(run_dir, tag, "logs"), timeout_s=args.timeout,
                               echo=False, script=BENCH_WORKER)
                if res.returncode != 0:
                    print(f"error: reference {args.profile_schedule} (repeat {rep + 1}) failed "
                          f"(exit {res.returncode}): {res.message}", file=sys.stderr)
                    return res.returncode
                ref_launches.append(read_ranks(job["out_dir"], world))
                print(f"[{k + 1}/{len(order)}] reference {args.profile_schedule} repeat {rep + 1}, "
                      f"actions timed ({res.wall_s:.0f} s launch)", flush=True)
            continue
        name, plan = plans[i]
        tag = f"r{rep}_{i}_{slug(name)}"
        job = {"mode": "bench", "device": rc.device, "name": name, "schedule": name, "raw": recipe.raw,
               "plan": plan.to_json(), "data_parallel": plan.data_parallel, "steps": args.warmup + args.steps,
               "out_dir": os.path.join(run_dir, tag, "result"), "action_times": bool(os.environ.get("HP_BENCH_ACTION_TIMES"))}
        res = launcher(job, world, os.path.join(run_dir, tag, "logs"), timeout_s=args.timeout, echo=False,
                     script=BENCH_WORKER)
        if res.returncode != 0:
            print(f"error: {name} (repeat {rep + 1}) failed (exit {res.returncode}): {res.message}", file=sys.stderr)
            return res.returncode
        ranks = []
        for r in range(world):
            with open(os.path.join(job["out_dir"], f"rank_{r}.json")) as f:
                ranks.append(json.load(f))
        kept = kept_steps(ranks, args.warmup)
        steps_of[name] += kept
        per_rank[name].append(ranks)
        busy = sum(1 for _, c in kept if c > args.max_contention)
        print(f"[{k + 1}/{len(order)}] {name} repeat {rep + 1}: median {median([t for t, _ in kept]) * 1e3:.1f} ms "
              f"over {len(kept)} steps, {busy} disturbed by other processes ({res.wall_s:.0f} s launch)", flush=True)
    profile_path = args.profile
    if rounds:
        from ..mpipe.profile import parse_profile
        from .profile import build_profile, merge_rounds, summary_lines, write_profile
        merged = merge_rounds(rounds)
        block = build_profile(recipe, plans[0][1], merged)
        comments = [f"median over {len(rounds)} profile launches interleaved with the bench"]
        if ref_launches:
            from .profile import apply_pipeline_costs, mean_data_ms, pipeline_action_medians, pipeline_lines
            times = pipeline_action_medians(ref_launches, args.warmup)
            block = apply_pipeline_costs(block, ref_plan, times, mean_data_ms(merged))
            comments += pipeline_lines(args.profile_schedule, times)
        profile_path = args.save_profile or os.path.join(run_dir, "profile.yaml")
        write_profile(profile_path, args.recipe, block, comments + summary_lines(plans[0][1], merged),
                      sys.argv[1:])
        recipe.profile = parse_profile(block)
        print(f"measured profile: {profile_path}")
    predicted = {n: predict(recipe, p) for n, p in plans}
    samples, dropped, fell_back = {}, {}, {}
    for n in names:
        samples[n], dropped[n], fell_back[n] = undisturbed(steps_of[n], args.max_contention)
        if fell_back[n]:
            print(f"warning: {n}: fewer than 3 undisturbed steps; the median uses every kept step "
                  f"(the machine was busy: rerun when it is quiet)", file=sys.stderr)
    rows = summarize(names, samples, {n: predicted[n]["step_s"] for n in names})
    for row, (name, plan) in zip(rows, plans):
        launches = [breakdown(rk, args.warmup) for rk in per_rank[name]]
        ranks = []
        for r in range(world):
            mine = [l[r] for l in launches]
            share = {k: median([m["share"][k] for m in mine]) for k in mine[0]["share"]}
            ranks.append({"rank": r, "device": r // plan.data_parallel, "share": share,
                          "interp_us_per_action": median([m["interp_us_per_action"] for m in mine]),
                          "n_actions": mine[0]["n_actions"],
                          "base_rss_mb": median([m["base_rss_mb"] for m in mine]),
                          "peak_rss_mb": median([m["peak_rss_mb"] for m in mine]),
                          "predicted_peak_mb": predicted[name]["peak_mb"].get(r // plan.data_parallel)})
        row["ranks"] = ranks
        row["interp_share"] = max(d["share"]["interp"] for d in ranks)
        row["samples_s"] = samples[name]
        row["median_all_steps_s"] = median([t for t, _ in steps_of[name]])
        row["repeat_medians_s"] = [median(kept_step_times(rk, args.warmup)) for rk in per_rank[name]]  # launch order
        row["dropped_disturbed"] = dropped[name]
        row["all_steps_kept_busy_machine"] = fell_back[name]
        row["contention"] = [c for _, c in steps_of[name]]
    print()
    print(format_table(rows))
    print()
    print(format_memory(rows))
    print()
    print(format_overhead(rows))
    print(f"\n{len(order)} launches in {time.time() - t_start:.0f} s")
    result = {"recipe": args.recipe, "profile": profile_path, "overrides": args.overrides,
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "ranks": world,
              "max_contention": args.max_contention, "profile_schedule": args.profile_schedule,
              "command": "hyperparallel " + " ".join(sys.argv[1:]), "schedules": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    if args.png:
        from .plot import bar_chart
        title = f"{stem}: {world} {rc.device} ranks, median of {args.repeats} x {args.steps} steps"
        if args.overrides:
            title += "\n" + ", ".join(args.overrides)
        bar_chart(rows, args.png, title=title)
        print(f"wrote {args.png}")
    return 0
