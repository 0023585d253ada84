"""``hyperparallel bench RECIPE --schedule A --schedule B ...``: schedules side by side on real ranks.

By default (``--rotate steps``) every repeat is one msrun launch in which every schedule runs
its derived programs for ``warmup + steps`` optimizer steps in rotation, step by step (A B C A B
C ..., starting at another schedule each repeat): a machine whose speed drifts over seconds hits
every schedule alike. ``--rotate launches`` gives each (repeat, schedule) its own launch,
alternating A B A B ... (and then also each schedule's own memory). The first ``warmup`` steps
of every schedule are discarded; a step's time is the slowest rank's (every step ends with a loss
all-reduce, so ranks agree to within it). Kept steps during which other processes used a rank's
core (the core's busy time in ``/proc/stat`` minus the rank's own CPU time; ranks are bound to
one core each) for more than ``--max-contention`` of the step are dropped and counted: on a
shared machine they measure the neighbours, not the schedule (with fewer than 3 undisturbed
steps all are kept, with a warning).

The prediction: a profile belongs to the machine it was measured on, so by default the profile
is measured in the same run (the tight-loop profile, then the compute costs from a real run of
the reference schedule ``--profile-schedule``, default gpipe, every action timed; the per-device
speed ``device_scale`` from every rank timing the same work). ``--profile FILE`` or
``--recipe-profile`` predict with a stored profile instead, with a warning when its
``measured_on`` is another machine.

Per schedule the table gives the median step time over all kept steps of all repeats, the ratio
``median(first schedule) / median(this)`` (> 1: faster than the first), the cost model's
predicted step time and the prediction error ``predicted / measured - 1``; per rank the peak
resident memory next to the cost model's peak memory; and the runtime's overhead: the
interpreter's own time (everything that is not MindSpore compute, communication, data
generation or the optimizer) plus the time a rank waited on a peer's host work
(:func:`host_stalls`), a stall the runtime causes that a compute/comm split books as
communication.
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
    p.add_argument("--repeats", type=int, default=3, help="repeats (default 3): one launch each running every schedule in rotation (--rotate steps), "
                        "or one launch per schedule (--rotate launches)")
    p.add_argument("--max-contention", type=float, default=0.1, metavar="FRAC",
                   help="drop kept steps during which other processes used a rank's core for more than FRAC "
                        "of the step (default 0.1; 1 keeps every step)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. mpipe.profile.regions.0.trainable=true")
    p.add_argument("--profile", default=None, metavar="FILE.yaml",
                   help="predict with mpipe.profile from this file (e.g. written by hyperparallel profile) instead "
                        "of measuring one (warns when it was measured on another machine)")
    p.add_argument("--recipe-profile", action="store_true",
                   help="predict with the recipe's own mpipe.profile instead of measuring one (warns when it was "
                        "measured on another machine)")
    p.add_argument("--measure-profile", action="store_true",
                   help="measure the profile in this run, on this machine (the default without --profile or "
                        "--recipe-profile): the tight-loop profile once per repeat, then the compute costs "
                        "in a pipeline context (--profile-schedule)")
    p.add_argument("--profile-schedule", default=None, metavar="S",
                   help="reference schedule whose real run, every action timed, gives the measured profile's "
                        "compute costs (default gpipe: not a compared schedule, so no prediction is fitted to "
                        "itself; 'none': the tight-loop costs; see hyperparallel profile --in-pipeline)")
    p.add_argument("--profile-samples", type=int, default=8, metavar="N",
                   help="when the profile is measured: steps of micro-batches the tight loop times per rank "
                        "(default 8)")
    p.add_argument("--rotate", default="steps", metavar="steps|launches",
                   help="steps (default): one launch per repeat runs every schedule (and the reference) step "
                        "by step in rotation, so all meet the same machine drift; launches: one launch per "
                        "schedule and repeat, alternating (also measures each schedule's own memory)")
    p.add_argument("--save-profile", default=None, metavar="FILE.yaml",
                   help="when the profile is measured: also write it here")
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


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def host_stalls(ranks: List[dict]) -> Dict[int, Dict[int, float]]:
    """Seconds each rank waited, per step, on host work of its peer (see ``TimedComm``).

    The k-th send from rank a to rank b is received by b's k-th receive from a (one FIFO channel
    per pair). A sender still inside its send while the receiver did host work before posting the
    receive waited on that host work (the overlap of the two intervals), and so did a receiver
    waiting inside its receive while the sender did host work before sending. Compute and the
    schedule's own waits are not counted: only time that host work placed between a compute and
    its communication cost the other side. Returns ``{rank: {step: seconds}}``."""
    ev = {res["rank"]: [(s["step"], e) for s in res["steps"] for e in s.get("p2p") or []] for res in ranks}
    out: Dict[int, Dict[int, float]] = {r: {} for r in ev}
    for a in ev:
        for b in ev:
            if a == b:
                continue
            sends = [(st, e) for st, e in ev[a] if e[0] == "send" and e[1] == b]
            recvs = [(st, e) for st, e in ev[b] if e[0] == "recv" and e[1] == a]
            for (s_step, s), (r_step, r) in zip(sends, recvs):
                _, _, s_from, s_in, s_out = s
                _, _, r_from, r_in, r_out = r
                late_recv = _overlap(r_from, r_in, s_in, s_out)   # a waited on b's host work
                late_send = _overlap(s_from, s_in, r_in, r_out)   # b waited on a's host work
                out[a][s_step] = out[a].get(s_step, 0.0) + late_recv
                out[b][r_step] = out[b].get(r_step, 0.0) + late_send
    return out


def breakdown(ranks: List[dict], warmup: int) -> List[dict]:
    """Per rank: shares of the step (kept steps) and the interpreter's own time per action;
    ``stall``: time this rank waited on a peer's host work (:func:`host_stalls`), part of comm."""
    out = []
    stalls = host_stalls(ranks)
    for res in sorted(ranks, key=lambda r: r["rank"]):
        kept = [s for s in res["steps"] if s["step"] >= warmup]
        tot = sum(s["step_s"] for s in kept) or 1.0
        share = {k: sum(s[k + "_s"] for s in kept) / tot
                 for k in ("compute", "accumulate", "comm", "data", "optimizer", "loss_reduce", "interp")}
        share["stall"] = sum(stalls.get(res["rank"], {}).get(s["step"], 0.0) for s in kept) / tot
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


def _median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None


def format_memory(rows: List[dict]) -> str:
    """Per rank memory; '-' where schedules shared a process (``--rotate steps``: use
    ``--rotate launches`` to measure each schedule's own memory)."""
    lines = ["| schedule | rank | peak RSS (MB) | RSS at start (MB) | growth (MB) | predicted peak (MB) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        for d in r["ranks"]:
            pred = d.get("predicted_peak_mb")
            if d["peak_rss_mb"] is None:
                lines.append(f"| `{r['schedule']}` | {d['rank']} | - | - | - | "
                             f"{'-' if pred is None else f'{pred:.2f}'} |")
                continue
            lines.append(f"| `{r['schedule']}` | {d['rank']} | {d['peak_rss_mb']:.0f} | {d['base_rss_mb']:.0f} | "
                         f"{d['peak_rss_mb'] - d['base_rss_mb']:.1f} | "
                         f"{'-' if pred is None else f'{pred:.2f}'} |")
    return "\n".join(lines)


def format_overhead(rows: List[dict]) -> str:
    """Shares of the step per rank. ``runtime overhead`` = the interpreter's own time plus the time
    the rank waited on a peer's host work (a stall the runtime causes; counted inside comm too)."""
    lines = ["| schedule | rank | compute | grad accumulation | comm (incl. waiting) | data | optimizer | "
             "interpreter | waited on peer's host work | runtime overhead | interpreter per action (us) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for d in r["ranks"]:
            s = d["share"]
            stall = s.get("stall", 0.0)
            lines.append(f"| `{r['schedule']}` | {d['rank']} | {s['compute']:.1%} | {s['accumulate']:.1%} | "
                         f"{s['comm']:.1%} | "
                         f"{s['data']:.1%} | {s['optimizer']:.1%} | {s['interp']:.2%} | {stall:.2%} | "
                         f"{s['interp'] + stall:.2%} | {d['interp_us_per_action']:.0f} |")
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


def measures_profile(args) -> bool:
    """Is the profile measured in this run? (the default: profiles belong to the machine they ran on)"""
    return bool(args.measure_profile or not (args.profile or getattr(args, "recipe_profile", False)))


def prepare(args):
    """Everything checked before launch. Returns (recipe, run config, [(name, plan)]); with
    ``--profile-schedule`` the list ends with ``(None, reference plan)`` (profiled, not compared)."""
    from ..mindspore.config import run_config_of
    from ..mpipe.check import assert_valid
    from ..mpipe.derive import derive_recipe
    from ..launch import msrun_overrides

    for flag, v, lo in (("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                        ("--profile-samples", args.profile_samples, 1)):
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
    if args.rotate not in ("steps", "launches"):
        raise SpecError("--rotate", f"must be steps or launches, got {args.rotate!r}")
    if args.measure_profile and args.profile:
        raise SpecError("--measure-profile", "give either --profile FILE or --measure-profile")
    if args.recipe_profile and (args.profile or args.measure_profile):
        raise SpecError("--recipe-profile", "give one of --recipe-profile, --profile FILE, --measure-profile")
    measuring = measures_profile(args)
    if args.profile_schedule and not measuring:
        raise SpecError("--profile-schedule", "only with a profile measured in this run "
                        "(not with --profile or --recipe-profile)")
    if args.save_profile and not measuring:
        raise SpecError("--save-profile", "only with a profile measured in this run "
                        "(not with --profile or --recipe-profile)")
    if measuring and args.profile_schedule is None:
        from .profile import DEFAULT_REFERENCE
        args.profile_schedule = DEFAULT_REFERENCE
    if args.profile_schedule == "none":
        args.profile_schedule = None
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
    if measuring and world < 2:
        raise SpecError("--measure-profile", "a measured profile needs >= 2 ranks (the link is measured between two); "
                        "give --profile FILE or --recipe-profile")
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
    measuring = measures_profile(args)
    if not measuring:
        from .machine import profile_warning
        warn = profile_warning(recipe.profile, rc.device, args.profile or args.recipe)
        if warn:
            print(warn, file=sys.stderr)
    how = ("in rotation, step by step, within each launch" if args.rotate == "steps"
           else "one launch each, alternating")
    print(f"bench {stem}: {len(names)} schedules x {args.repeats} repeats ({how}), "
          f"{args.warmup} warm-up + {args.steps} measured steps each, on {world} {rc.device} ranks; "
          f"profile: {'measured in this run' if measuring else (args.profile or 'the recipe')}; "
          f"run dir {run_dir}", flush=True)
    if launcher is None:
        from ..launch import launch as launcher
    steps_of: Dict[str, List[tuple]] = {n: [] for n in names}
    per_rank: Dict[str, List[List[dict]]] = {n: [] for n in names}
    t_start = time.time()
    rounds: List[List[dict]] = []
    ref_launches: List[List[dict]] = []
    from .profile import profile_job, read_ranks, reference_job

    def case_job(rep: int, i: int) -> dict:
        name, plan = plans[i]
        return {"mode": "bench", "device": rc.device, "name": name, "schedule": name, "raw": recipe.raw,
                "plan": plan.to_json(), "data_parallel": plan.data_parallel, "steps": args.warmup + args.steps,
                "out_dir": os.path.join(run_dir, f"r{rep}_{i}_{slug(name)}", "result"),
                "action_times": bool(os.environ.get("HP_BENCH_ACTION_TIMES"))}

    def ref_job(rep: int) -> dict:
        return reference_job(recipe, rc, ref_plan, args.profile_schedule, args.warmup + args.steps,
                             os.path.join(run_dir, f"r{rep}_reference_{slug(args.profile_schedule)}", "result"))

    def prof_job(rep: int) -> dict:
        return profile_job(recipe, rc, plans[0][1], args.profile_samples, 1,
                           os.path.join(run_dir, f"r{rep}_profile", "result"))

    def take(i: int, rep: int, out_dir: str, tag: str) -> None:
        name = names[i]
        ranks = read_ranks(out_dir, world)
        kept = kept_steps(ranks, args.warmup)
        steps_of[name] += kept
        per_rank[name].append(ranks)
        busy = sum(1 for _, c in kept if c > args.max_contention)
        print(f"{tag} {name} repeat {rep + 1}: median {median([t for t, _ in kept]) * 1e3:.1f} ms "
              f"over {len(kept)} steps, {busy} disturbed by other processes", flush=True)

    def launch_or_fail(job: dict, tag: str, what: str):
        res = launcher(job, world, os.path.join(run_dir, tag, "logs"), timeout_s=args.timeout, echo=False,
                       script=BENCH_WORKER)
        if res.returncode != 0:
            print(f"error: {what} failed (exit {res.returncode}): {res.message}", file=sys.stderr)
        return res

    if args.rotate == "steps":
        for rep in range(args.repeats):
            k = rep % len(plans)   # the rotation starts at another schedule every repeat
            order = list(range(k, len(plans))) + list(range(k))
            cases = ([ref_job(rep)] if ref_plan is not None else []) + [case_job(rep, i) for i in order]
            job = {"mode": "rotation", "device": rc.device, "data_parallel": plans[0][1].data_parallel,
                   "profile": prof_job(rep) if measuring else None, "cases": cases}
            res = launch_or_fail(job, f"r{rep}_rotation", f"rotation launch (repeat {rep + 1})")
            if res.returncode != 0:
                return res.returncode
            print(f"[{rep + 1}/{args.repeats}] one launch ({res.wall_s:.0f} s): "
                  f"{'profile, ' if measuring else ''}"
                  f"{'reference ' + args.profile_schedule + ', ' if ref_plan is not None else ''}"
                  f"{', '.join(names[i] for i in order)} in rotation", flush=True)
            if measuring:
                rounds.append(read_ranks(job["profile"]["out_dir"], world))
            if ref_plan is not None:
                ref_launches.append(read_ranks(cases[0]["out_dir"], world))
            for i in order:
                take(i, rep, case_job(rep, i)["out_dir"], "   ")
    else:
        order = run_order(len(plans), args.repeats)
        if measuring:  # one profile launch at the head of every round: P A B P A B ...
            order = [x for rep in range(args.repeats) for x in [(rep, -1)] + [(rep, i) for i in range(len(plans))]]
        for k, (rep, i) in enumerate(order):
            if i < 0:
                job = prof_job(rep)
                res = launch_or_fail(job, f"r{rep}_profile", f"profile (repeat {rep + 1})")
                if res.returncode != 0:
                    return res.returncode
                rounds.append(read_ranks(job["out_dir"], world))
                print(f"[{k + 1}/{len(order)}] profile repeat {rep + 1} ({res.wall_s:.0f} s launch)", flush=True)
                if ref_plan is not None:
                    job = ref_job(rep)
                    res = launch_or_fail(job, f"r{rep}_reference_{slug(args.profile_schedule)}",
                                         f"reference {args.profile_schedule} (repeat {rep + 1})")
                    if res.returncode != 0:
                        return res.returncode
                    ref_launches.append(read_ranks(job["out_dir"], world))
                    print(f"[{k + 1}/{len(order)}] reference {args.profile_schedule} repeat {rep + 1}, "
                          f"actions timed ({res.wall_s:.0f} s launch)", flush=True)
                continue
            job = case_job(rep, i)
            res = launch_or_fail(job, f"r{rep}_{i}_{slug(names[i])}", f"{names[i]} (repeat {rep + 1})")
            if res.returncode != 0:
                return res.returncode
            take(i, rep, job["out_dir"], f"[{k + 1}/{len(order)}]")
    profile_path = args.profile or (None if measuring else args.recipe)
    if rounds:
        from ..mpipe.profile import parse_profile
        from .profile import build_profile, merge_rounds, summary_lines, write_profile
        merged = merge_rounds(rounds)
        block = build_profile(recipe, plans[0][1], merged)
        comments = [f"median over {len(rounds)} profile measurements, one per repeat of the bench"]
        if ref_launches:
            from .profile import apply_pipeline_costs, mean_data_ms, pipeline_action_medians, pipeline_lines
            from .profile import runtime_overheads
            times = pipeline_action_medians(ref_launches, args.warmup)
            block = apply_pipeline_costs(block, ref_plan, times, mean_data_ms(merged))
            block.update(runtime_overheads(ref_launches, ref_plan, args.warmup))
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
                          "base_rss_mb": _median_or_none([m["base_rss_mb"] for m in mine]),
                          "peak_rss_mb": _median_or_none([m["peak_rss_mb"] for m in mine]),
                          "predicted_peak_mb": predicted[name]["peak_mb"].get(r // plan.data_parallel)})
        row["ranks"] = ranks
        row["interp_share"] = max(d["share"]["interp"] for d in ranks)
        row["overhead_share"] = max(d["share"]["interp"] + d["share"].get("stall", 0.0) for d in ranks)
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
    n_launches = args.repeats if args.rotate == "steps" else len(order)
    print(f"\n{n_launches} launches in {time.time() - t_start:.0f} s")
    result = {"recipe": args.recipe, "profile": profile_path, "overrides": args.overrides,
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "ranks": world,
              "max_contention": args.max_contention, "rotate": args.rotate,
              "profile_schedule": args.profile_schedule if measuring else None,
              "profile_measured_here": measuring,
              "device_scale": list(recipe.profile.device_scale),
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
