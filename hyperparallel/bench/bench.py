"""``hyperparallel bench RECIPE --schedule A --schedule B ...``: schedules side by side on real ranks.

Each repeat is one msrun launch running every schedule step by step in rotation (``--rotate
steps``), or one launch per schedule (``--rotate launches``); warm-up steps and steps disturbed by
other processes are left out; the profile is measured in the run unless one is given; the table
sets the medians against the cost model's predictions, with per-rank memory and runtime overhead
(the interpreter's own time plus waits on a peer's host work, :func:`host_stalls`). The method,
with every JSON key, is in ``docs/bench.md``.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Dict, List, Optional

from ..errors import PlanError, SpecError, whole
from ..util import error, median, output_file, quantile, slug, write_text
from ..recipe.cases import split_case
from .profile import BENCH_WORKER


# -- pure orchestration (unit-tested) ---------------------------------------------------------

def kept_steps(ranks: List[dict], warmup: int) -> List[tuple]:
    """Per kept step (index >= warmup, and no rank compiled a graph in it: the first step of a new input
    shape is compile time, not step time): (the slowest rank's step time in seconds, contention: the
    largest share of the step during which another process used a rank's core)."""
    by_step: Dict[int, list] = {}
    compiled = compile_steps(ranks)
    if all(s["step"] in compiled for res in ranks for s in res["steps"] if s["step"] >= warmup):
        compiled = set()   # every measured step compiled (too few steps for the shapes): keep them, said in the table
    for res in ranks:
        for s in res["steps"]:
            if s["step"] >= warmup and s["step"] not in compiled:
                cur = by_step.setdefault(s["step"], [0.0, 0.0])
                cur[0] = max(cur[0], s["step_s"])
                cur[1] = max(cur[1], s.get("foreign_cpu_s", 0.0) / s["step_s"] if s["step_s"] > 0 else 0.0)
    return [tuple(by_step[k]) for k in sorted(by_step)]


def compile_steps(ranks: List[dict]) -> set:
    """The steps in which some rank compiled a graph (``mpipe.compile: jit``, a new input shape)."""
    return {s["step"] for res in ranks for s in res["steps"] if s.get("compiles")}


def compile_totals(ranks_of_launches: List[List[dict]]) -> List[dict]:
    """Per rank and chunk, the median over launches of its compiles (distinct input shapes) and their
    first-call time (compile + one run), from the ranks' ``compile`` records."""
    out: Dict[tuple, list] = {}
    for ranks in ranks_of_launches:
        for res in ranks:
            for c in res.get("compile") or []:
                out.setdefault((res["rank"], c["chunk"], c["mode"]), []).append(c)
    return [{"rank": r, "chunk": ch, "mode": mode, "compiles": median([c["compiles"] for c in cs]),
             "compile_s": median([c["compile_s"] for c in cs])} for (r, ch, mode), cs in sorted(out.items())]


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
    """Seconds each rank waited, per step, on host work of its peer (see ``TimingHooks``).

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
                    "peak_rss_mb": res["peak_rss_mb"], "memory": max_memory([s.get("memory") for s in kept])})
    return out


MEMORY_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "optimizer_global_bytes", "peak_held_bytes")


def max_memory(recs: List[Optional[dict]]) -> Optional[dict]:
    """The largest of each figure of a rank's memory records (:mod:`hyperparallel.runtime.memory`; its
    steps, or its launches): peak held forwards per region and in all, each byte count; None when none
    was measured (a result written before the bench measured memory)."""
    recs = [m for m in recs if m]
    if not recs:
        return None
    held: Dict[str, int] = {}
    for m in recs:
        for r, n in m["peak_held"].items():
            held[r] = max(held.get(r, 0), n)
    out = {"peak_held": held, "peak_held_total": max(m["peak_held_total"] for m in recs)}
    out.update({k: max(m[k] for m in recs) for k in MEMORY_KEYS})
    return out


def state_mb(mem: Optional[dict]) -> Optional[float]:
    """Measured parameters + grads + optimizer state + held boundary tensors of a rank, in MB (None: not measured)."""
    if not mem:
        return None
    return sum(mem[k] for k in MEMORY_KEYS) / (1024.0 * 1024.0)


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
    """Per schedule the times and, when the ranks measured their memory, per rank (``r0 / r1 / ...``) that
    memory: parameters, grads, optimizer state and held boundary tensors (MB), and the peak held forwards
    (measured, the cost model's in parentheses)."""
    with_memory = any(d.get("memory") for r in rows for d in r.get("ranks") or [])
    head = "| schedule | median step (ms) | ratio vs first | predicted (ms) | error |"
    lines = [head + (" memory per rank (MB) | held forwards per rank (predicted) |" if with_memory else ""),
             "|---|---|---|---|---|" + ("---|---|" if with_memory else "")]
    for r in rows:
        pred = "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s'] * 1e3:.1f}"
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        line = f"| `{r['schedule']}` | {r['median_step_s'] * 1e3:.1f} | {r['ratio']:.2f}x | {pred} | {err} |"
        if with_memory:
            ranks = r.get("ranks") or []
            mem = " / ".join("-" if state_mb(d.get("memory")) is None else f"{state_mb(d['memory']):.2f}"
                             for d in ranks) or "-"
            held = " / ".join(f"{d['memory']['peak_held_total'] if d.get('memory') else '-'} "
                              f"({d.get('predicted_held_total', '-')})" for d in ranks) or "-"
            line += f" {mem} | {held} |"
        lines.append(line)
    return "\n".join(lines)


def _median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None


def format_compiles(rows: List[dict]) -> str:
    """Per schedule and rank: each chunk's mode, compiles (distinct input shapes) and their first-call time
    (compile + one run; medians over the launches), and the measured steps left out for compiling."""
    lines = ["| schedule | rank | chunks (mode: compiles, first-call s) | steps left out (compiled) |",
             "|---|---|---|---|"]
    for r in rows:
        by_rank: Dict[int, list] = {}
        for c in r.get("compile") or []:
            by_rank.setdefault(c["rank"], []).append(c)
        for rank, cs in sorted(by_rank.items()):
            chunks = ", ".join(f"{c['chunk']} {c['mode']}: {c['compiles']:g}, {c['compile_s']:.2f}" for c in cs)
            lines.append(f"| `{r['schedule']}` | {rank} | {chunks} | {r.get('compile_steps_dropped', 0)} |")
    return "\n".join(lines)


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
    ranks = [d for r in rows for d in r["ranks"]]
    if any(d["peak_rss_mb"] is None for d in ranks):
        lines.append("\n'-' under RSS: the schedules shared one process per launch (--rotate steps), so no "
                     "schedule has its own peak; --rotate launches measures each schedule's own memory")
    if ranks and all(not d.get("predicted_peak_mb") for d in ranks):
        lines.append("\npredicted peak 0: the profile gives no memory sizes (activation_mb, output_mb, "
                     "param_mb); hyperparallel profile --out measures them")
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
    from ..recipe import load_raw
    from ..runconfig import load_parsed, parse_recipe
    if not profile_path:
        return load_parsed(path, overrides)
    if not os.path.isfile(profile_path):
        raise SpecError("--profile", f"file not found: {profile_path}")
    prof_raw = load_raw(profile_path)
    prof = (prof_raw.get("mpipe") or {}).get("profile") if isinstance(prof_raw, dict) else None
    if not isinstance(prof, dict):
        raise SpecError("--profile", f"{profile_path} has no mpipe.profile mapping")
    raw = load_raw(path)
    if not isinstance(raw.get("mpipe"), dict):
        raise SpecError("mpipe", "missing; add an mpipe: section")
    raw["mpipe"]["profile"] = copy.deepcopy(prof)
    return parse_recipe(raw, path=path, overrides=overrides)


def measures_profile(args) -> bool:
    """Is the profile measured in this run? (the default: profiles belong to the machine they ran on)"""
    return bool(args.measure_profile or not (args.profile or getattr(args, "recipe_profile", False)))


def prepare(args):
    """Everything checked before launch. Returns (recipe, run config, [(name, plan)]); with
    ``--profile-schedule`` the list ends with ``(None, reference plan)`` (profiled, not compared)."""
    from ..launch import preflight
    from ..recipe import checked_plan, refuse_over_memory_limit

    for flag, v, lo in (("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                        ("--profile-samples", args.profile_samples, 1)):
        whole(flag, v, lo)
    if not 0 < args.max_contention <= 1:
        raise SpecError("--max-contention", f"must be in (0, 1], got {args.max_contention}")
    for flag, path, ext in (("--out", args.out, ".json"), ("--png", args.png, ".png")):
        if path is None:
            continue
        if not path.endswith(ext):
            raise SpecError(flag, f"must name a {ext} file, got {path!r}")
        output_file(flag, path)
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
    if args.save_profile:
        output_file("--save-profile", args.save_profile, inputs=(args.recipe,))
    recipe = load_with_profile(args.recipe, args.overrides, args.profile)
    preflight(recipe.pipeline_stage * recipe.data_parallel, recipe.device)
    rc = recipe.run
    from ..launch import refuse_tensor_parallel
    refuse_tensor_parallel(recipe, "hyperparallel bench")
    for line in rc.model.notes():   # said once here, before launch; the ranks build the same model silently
        print(f"note: {line}", flush=True)
    scheds = args.schedule or [recipe.schedule if isinstance(recipe.schedule, str) else json.dumps(recipe.schedule)]
    if len(set(scheds)) != len(scheds):
        raise SpecError("--schedule", "each schedule once (repeats come from --repeats)")
    plans = []
    args.case_raw = {}   # a case's own recipe (SCHEDULE|key=value: its settings applied), by name
    for s in scheds:
        sched, sets = split_case(s)
        rec, rc_ = recipe, rc
        if sets:
            rec = load_with_profile(args.recipe, list(args.overrides) + sets, args.profile)
            rc_ = rec.run
            if (rec.pipeline_stage, rec.data_parallel) != (recipe.pipeline_stage, recipe.data_parallel):
                raise SpecError("--schedule", f"{s!r}: a case's settings must keep pipeline_stage and data_parallel")
            args.case_raw[s] = rec.raw
        plan = checked_plan(rec, sched)
        refuse_over_memory_limit(rec, plan)
        rc_.check_plan(plan)
        plans.append((s, plan))
    if getattr(args, "profile_schedule", None):
        ref = checked_plan(recipe, args.profile_schedule)
        if ref.num_devices * ref.data_parallel != plans[0][1].num_devices * plans[0][1].data_parallel:
            raise SpecError("--profile-schedule", f"{args.profile_schedule} needs a different number of ranks")
        plans.append((None, ref))  # the reference: profiled, not compared (see run)
    world = plans[0][1].num_devices * plans[0][1].data_parallel
    if measuring and world < 2:
        raise SpecError("--measure-profile", "a measured profile needs >= 2 ranks (the link is measured between two); "
                        "give --profile FILE or --recipe-profile")
    return recipe, rc, plans


def predict(recipe, plan) -> dict:
    from ..mpipe.cost import simulate
    # next-step spill: the steady state is the last of 3 steps (as hyperparallel simulate does)
    rep = simulate(plan, recipe.profile, steps=3 if any(a.step for p in plan.programs.values() for a in p) else 1)
    return {"step_s": rep.step_ms / 1e3,
            "peak_mb": {d.device: d.peak_memory_mb for d in rep.devices},
            "held_total": {d.device: d.peak_held_total for d in rep.devices},
            "held": {d.device: dict(d.peak_held) for d in rep.devices}}


# -- the command ------------------------------------------------------------------------------

def launch_plan(rotate: str, n: int, repeats: int, measuring: bool, reference: bool) -> List[tuple]:
    """The launches of a bench, as ``(repeat, [(part, schedule index), ...])`` with part ``profile``
    (the tight-loop profile), ``reference`` (the reference schedule, every action timed) or ``case``.
    ``steps``: one launch per repeat, its cases in rotation starting at another schedule each repeat;
    ``launches``: one launch per part, the profile and reference at the head of every round."""
    head = ([("profile", -1)] if measuring else []) + ([("reference", -1)] if reference else [])
    if rotate == "steps":
        out = []
        for rep in range(repeats):
            k = rep % n
            out.append((rep, head + [("case", i) for i in list(range(k, n)) + list(range(k))]))
        return out
    return [(rep, [part]) for rep in range(repeats) for part in head + [("case", i) for i in range(n)]]


class _Bench:
    """One ``hyperparallel bench`` run: its jobs, its launches, what they measured."""

    def __init__(self, args, recipe, rc, plans, ref_plan, run_dir, launcher):
        self.args, self.recipe, self.rc, self.plans, self.ref_plan = args, recipe, rc, plans, ref_plan
        self.names = [n for n, _ in plans]
        self.world = plans[0][1].num_devices * plans[0][1].data_parallel
        self.run_dir, self.launcher = run_dir, launcher
        self.steps_of: Dict[str, List[tuple]] = {n: [] for n in self.names}
        self.per_rank: Dict[str, List[List[dict]]] = {n: [] for n in self.names}
        self.rounds: List[List[dict]] = []         # tight-loop profile measurements, one per repeat
        self.ref_launches: List[List[dict]] = []   # reference-schedule runs, one per repeat

    def tag(self, part: str, rep: int, i: int) -> str:
        if part == "profile":
            return f"r{rep}_profile"
        if part == "reference":
            return f"r{rep}_reference_{slug(self.args.profile_schedule)}"
        return f"r{rep}_{i}_{slug(self.names[i])}"

    def job(self, part: str, rep: int, i: int) -> dict:
        from .profile import profile_job, reference_job
        a, out = self.args, os.path.join(self.run_dir, self.tag(part, rep, i), "result")
        if part == "profile":
            return profile_job(self.recipe, self.rc, self.plans[0][1], a.profile_samples, 1, out)
        if part == "reference":
            return reference_job(self.recipe, self.rc, self.ref_plan, a.profile_schedule, a.warmup + a.steps, out)
        name, plan = self.plans[i]
        raw = getattr(a, "case_raw", {}).get(name, self.recipe.raw)
        return {"mode": "bench", "device": self.rc.device, "name": name, "schedule": name, "raw": raw,
                "plan": plan.to_json(), "data_parallel": plan.data_parallel, "steps": a.warmup + a.steps,
                "out_dir": out, "action_times": bool(os.environ.get("HP_BENCH_ACTION_TIMES"))}

    def what(self, part: str, i: int) -> str:
        return {"profile": "profile", "reference": f"reference {self.args.profile_schedule}"}.get(part) or \
            self.names[i]

    def run_launch(self, k: int, total: int, rep: int, parts: List[tuple]) -> int:
        """One launch: a rotation of all its parts (``--rotate steps``) or one part; reads what it measured."""
        from .profile import read_ranks
        jobs = [(part, i, self.job(part, rep, i)) for part, i in parts]
        rotation = self.args.rotate == "steps"
        if rotation:
            tag, what = f"r{rep}_rotation", f"rotation launch (repeat {rep + 1})"
            job = {"mode": "rotation", "device": self.rc.device, "data_parallel": self.plans[0][1].data_parallel,
                   "profile": next((j for p, _, j in jobs if p == "profile"), None),
                   "cases": [j for p, _, j in jobs if p != "profile"]}
        else:
            (part, i, job), = jobs
            tag, what = self.tag(part, rep, i), f"{self.what(part, i)} (repeat {rep + 1})"
        res = self.launcher(job, self.world, os.path.join(self.run_dir, tag, "logs"), timeout_s=self.args.timeout,
                            echo=False, script=BENCH_WORKER)
        if res.returncode != 0:
            print(f"error: {what} failed (exit {res.returncode}): {res.message}", file=sys.stderr)
            return res.returncode
        if rotation:
            print(f"[{rep + 1}/{self.args.repeats}] one launch ({res.wall_s:.0f} s): "
                  f"{', '.join(self.what(p, i) for p, i, _ in jobs)} in rotation", flush=True)
        for part, i, j in jobs:
            ranks = read_ranks(j["out_dir"], self.world)
            if part == "case":
                self.take(i, rep, ranks, "   " if rotation else f"[{k + 1}/{total}]")
                continue
            (self.rounds if part == "profile" else self.ref_launches).append(ranks)
            if not rotation:
                timed = "" if part == "profile" else ", actions timed"
                print(f"[{k + 1}/{total}] {self.what(part, i)} repeat {rep + 1}{timed} ({res.wall_s:.0f} s launch)",
                      flush=True)
        return 0

    def take(self, i: int, rep: int, ranks: List[dict], tag: str) -> None:
        name = self.names[i]
        kept = kept_steps(ranks, self.args.warmup)
        self.steps_of[name] += kept
        self.per_rank[name].append(ranks)
        busy = sum(1 for _, c in kept if c > self.args.max_contention)
        print(f"{tag} {name} repeat {rep + 1}: median {median([t for t, _ in kept]) * 1e3:.1f} ms "
              f"over {len(kept)} steps, {busy} disturbed by other processes", flush=True)

    def rows(self, predicted: Dict[str, dict]) -> List[dict]:
        """The result table: per schedule the step-time statistics against the prediction, per rank the
        time shares and memory (see the module docstring)."""
        a = self.args
        samples, dropped, fell_back = {}, {}, {}
        for n in self.names:
            samples[n], dropped[n], fell_back[n] = undisturbed(self.steps_of[n], a.max_contention)
            if fell_back[n]:
                print(f"warning: {n}: fewer than 3 undisturbed steps; the median uses every kept step "
                      f"(the machine was busy: rerun when it is quiet)", file=sys.stderr)
        rows = summarize(self.names, samples, {n: predicted[n]["step_s"] for n in self.names})
        for row, (name, plan) in zip(rows, self.plans):
            launches = [breakdown(rk, a.warmup) for rk in self.per_rank[name]]
            ranks = []
            for r in range(self.world):
                mine = [l[r] for l in launches]
                share = {k: median([m["share"][k] for m in mine]) for k in mine[0]["share"]}
                ranks.append({"rank": r, "device": r // plan.data_parallel, "share": share,
                              "interp_us_per_action": median([m["interp_us_per_action"] for m in mine]),
                              "n_actions": mine[0]["n_actions"],
                              "base_rss_mb": _median_or_none([m["base_rss_mb"] for m in mine]),
                              "peak_rss_mb": _median_or_none([m["peak_rss_mb"] for m in mine]),
                              "predicted_peak_mb": predicted[name]["peak_mb"].get(r // plan.data_parallel),
                              "memory": max_memory([m.get("memory") for m in mine]),
                              "predicted_held_total": predicted[name].get("held_total", {}).get(
                                  r // plan.data_parallel),
                              "predicted_held": predicted[name].get("held", {}).get(r // plan.data_parallel)})
            row["ranks"] = ranks
            row["interp_share"] = max(d["share"]["interp"] for d in ranks)
            row["overhead_share"] = max(d["share"]["interp"] + d["share"].get("stall", 0.0) for d in ranks)
            row["samples_s"] = samples[name]
            row["median_all_steps_s"] = median([t for t, _ in self.steps_of[name]])
            row["repeat_medians_s"] = [median(kept_step_times(rk, a.warmup)) for rk in self.per_rank[name]]
            row["dropped_disturbed"] = dropped[name]
            row["all_steps_kept_busy_machine"] = fell_back[name]
            row["contention"] = [c for _, c in self.steps_of[name]]
            row["compile"] = compile_totals(self.per_rank[name])
            row["compile_steps_dropped"] = sum(len({st["step"] for res in rk for st in res["steps"]
                                                    if st["step"] >= a.warmup}) - len(kept_steps(rk, a.warmup))
                                               for rk in self.per_rank[name])
        return rows


def run(args, launcher=None) -> int:
    """``launcher``: stands in for :func:`hyperparallel.launch.launch` (tests). ``--compile A --compile B``:
    one bench per mode (each with its profile measured in the run), then the modes compared."""
    modes = getattr(args, "compile", None) or []
    if len(modes) <= 1:
        if modes:
            args.overrides = list(args.overrides) + [f"mpipe.compile={modes[0]}"]
        return _run_mode(args, launcher)[0]
    return run_modes(args, modes, launcher)


def run_modes(args, modes: List[str], launcher=None) -> int:
    """Every schedule under each compile mode: the benches one after the other (each in ``RUN_DIR/MODE``),
    then per schedule each mode's median against the first mode's, with the spread over the repeats."""
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    base = os.path.abspath(args.run_dir or os.path.join("runs", slug(f"bench_{stem}")))
    results = {}
    for m in modes:
        a = copy.copy(args)
        a.compile, a.overrides = None, list(args.overrides) + [f"mpipe.compile={m}"]
        a.run_dir, a.out, a.png = os.path.join(base, m), None, None
        a.save_profile = None if not args.save_profile else args.save_profile.replace(".yaml", f".{m}.yaml")
        print(f"== mpipe.compile: {m} ==", flush=True)
        code, res = _run_mode(a, launcher)
        if code:
            return code
        results[m] = res
    rows = compare_modes(modes, results)
    print()
    print(format_modes(modes, rows))
    if args.out:
        write_text(args.out, json.dumps({"recipe": args.recipe, "modes": modes, "compare": rows, "results": results,
                                         "command": "hyperparallel " + " ".join(sys.argv[1:])}, indent=1))
        print(f"wrote {args.out}")
    return 0


def compare_modes(modes: List[str], results: Dict[str, dict]) -> List[dict]:
    """Per schedule: each mode's median step and prediction, its speed-up over the first mode (ratio of
    medians) and the spread of that ratio over the repeats (pairs of repeat medians), and its compiles."""
    base = modes[0]
    rows = []
    for i, first in enumerate(results[base]["schedules"]):
        row = {"schedule": first["schedule"], "modes": {}}
        for m in modes:
            r = results[m]["schedules"][i]
            pairs = [b / x for b, x in zip(first["repeat_medians_s"], r["repeat_medians_s"]) if x > 0]
            row["modes"][m] = {"median_step_s": r["median_step_s"], "predicted_s": r.get("predicted_step_s"),
                               "error": r.get("error"), "speedup": first["median_step_s"] / r["median_step_s"],
                               "speedup_repeats": [min(pairs), max(pairs)] if pairs else None,
                               "compiles": sum(c["compiles"] for c in r.get("compile", [])),
                               "compile_s": sum(c["compile_s"] for c in r.get("compile", [])),
                               "compile_steps_dropped": r.get("compile_steps_dropped", 0)}
        rows.append(row)
    return rows


def format_modes(modes: List[str], rows: List[dict]) -> str:
    head = "| schedule | mode | median step (ms) | predicted (ms) | error | speed-up vs " + modes[0] + \
        " | over repeats | compiles | compile time (s) |"
    lines = [head, "|" + "---|" * 9]
    for row in rows:
        for m in modes:
            d = row["modes"][m]
            pred = f"{d['predicted_s'] * 1e3:.1f}" if d.get("predicted_s") else "-"
            err = f"{d['error']:+.1%}" if d.get("error") is not None else "-"
            rep = f"{d['speedup_repeats'][0]:.2f}-{d['speedup_repeats'][1]:.2f}x" if d["speedup_repeats"] else "-"
            lines.append(f"| `{row['schedule']}` | {m} | {d['median_step_s'] * 1e3:.1f} | {pred} | {err} | "
                         f"{d['speedup']:.2f}x | {rep} | {d['compiles']:g} | {d['compile_s']:.2f} |")
    return "\n".join(lines)


def _run_mode(args, launcher=None):
    """One bench (one compile mode): (exit status, the result dict or None)."""
    try:
        recipe, rc, plans = prepare(args)
    except (SpecError, PlanError) as e:
        return error(str(e).splitlines()[0]), None
    ref_plan = plans.pop()[1] if plans[-1][0] is None else None
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = os.path.abspath(args.run_dir or os.path.join("runs", slug(f"bench_{stem}")))
    measuring = measures_profile(args)
    if not measuring:
        from .machine import profile_warning
        warn = profile_warning(recipe.profile, rc.device, args.profile or args.recipe)
        if warn:
            print(warn, file=sys.stderr)
    if launcher is None:
        from ..launch import launch as launcher
    b = _Bench(args, recipe, rc, plans, ref_plan, run_dir, launcher)
    how = ("in rotation, step by step, within each launch" if args.rotate == "steps"
           else "one launch each, alternating")
    print(f"bench {stem}: {len(b.names)} schedules x {args.repeats} repeats ({how}), "
          f"{args.warmup} warm-up + {args.steps} measured steps each, on {b.world} {rc.device} ranks; "
          f"profile: {'measured in this run' if measuring else (args.profile or 'the recipe')}; "
          f"run dir {run_dir}", flush=True)
    t_start = time.time()
    launches = launch_plan(args.rotate, len(b.names), args.repeats, measuring, ref_plan is not None)
    for k, (rep, parts) in enumerate(launches):
        rc_ = b.run_launch(k, len(launches), rep, parts)
        if rc_:
            return rc_, None
    profile_path = args.profile or (None if measuring else args.recipe)
    if b.rounds:
        from ..mpipe.profile import parse_profile
        from .profile import measured_profile, write_profile
        ref = (ref_plan, b.ref_launches, args.profile_schedule, args.warmup) if b.ref_launches else None
        block, comments = measured_profile(recipe, plans[0][1], b.rounds, ref)
        profile_path = args.save_profile or os.path.join(run_dir, "profile.yaml")
        write_profile(profile_path, args.recipe, block, comments, sys.argv[1:])
        recipe.profile = parse_profile(block)
        print(f"measured profile: {profile_path}")
    rows = b.rows({n: predict(recipe, p) for n, p in plans})
    print()
    print(format_table(rows))
    print()
    print(format_memory(rows))
    print()
    print(format_overhead(rows))
    print()
    print(format_compiles(rows))
    print(f"\n{len(launches)} launches in {time.time() - t_start:.0f} s")
    result = {"recipe": args.recipe, "profile": profile_path, "overrides": args.overrides,
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "ranks": b.world,
              "max_contention": args.max_contention, "rotate": args.rotate,
              "profile_schedule": args.profile_schedule if measuring else None,
              "profile_measured_here": measuring,
              "device_scale": list(recipe.profile.device_scale),
              "compile": rc.compile, "command": "hyperparallel " + " ".join(sys.argv[1:]), "schedules": rows}
    if args.out:
        write_text(args.out, json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    if args.png:
        from .plot import bar_chart
        title = f"{stem}: {b.world} {rc.device} ranks, median of {args.repeats} x {args.steps} steps"
        if args.overrides:
            title += "\n" + ", ".join(args.overrides)
        bar_chart(rows, args.png, title=title)
        print(f"wrote {args.png}")
    return 0, result
