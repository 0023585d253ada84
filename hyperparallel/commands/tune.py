"""``hyperparallel tune RECIPE``: the best plan of the schedule algebra for a recipe under a memory limit.

Searches orders, V, M (at the recipe's global batch), the encoder's placement and transpose options and
the LLM's layer split (:mod:`hyperparallel.tune`); prints the ranked table, the counts (searched,
derived, dropped by reason, kept) and the chosen split as MindFormers' ``offset``; ``--out`` writes the
first candidate as a recipe overlay; ``--verify N`` runs the top N, the recipe's own schedule and 1F1B
on the recipe's ranks in one ``bench`` run (:mod:`hyperparallel.bench.verify`).

``--json`` prints one object: ``recipe``, ``overrides``, ``memory_limit_gb``, ``top``, ``batch``,
``space``, ``counts``, ``refused``, ``seconds``, ``candidates`` (``rank``, ``schedule``, ``spec``,
``V``, ``M``, ``micro_batch_size``, ``layers``, ``offset``, ``split``, ``step_ms``, ``bubble_ratio``,
``peak_memory_mb`` per device, ``peak_mb``, ``peak_device``, ``keys``, ``same_plan``: the other spellings
that derived this very plan), ``recipe_schedule``, ``out``, ``profile_spread`` (the largest spread over the
repeats of a measured profile: ``spread``, ``cost``, ``profile``, ``repeats``; null for a hand-written one),
``margin`` (rank 1's predicted margin ``over`` the recipe's own schedule or rank 2), ``within_noise``
(margin < spread; null when either is missing) and, with ``--verify``, ``verify``.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Optional

from ..mpipe.cost import simulate
from ..errors import PlanError, SpecError, whole
from ..mpipe.profile import parse_profile, profile_spread
from ..mpipe.table import text_table
from ..recipe import checked_plan, load_raw
from ..recipe.files import check_override_key
from ..recipe.recipe import READ_KEYS
from ..runconfig import load_parsed
from ..tune.overlay import offset_line, overlay_text
from ..tune.search import Outcome, Scored, lowest_peak, search
from ..tune.space import Space
from ..util import output_file, write_text

if TYPE_CHECKING:
    from ..recipe.recipe import Recipe

GB = 1000.0   # MB per GB, as README's peak-memory figures


def _check_args(args) -> None:
    whole("--top", args.top)
    if args.memory_limit is not None and not args.memory_limit > 0:
        raise SpecError("--memory-limit", f"must be a number of GB > 0, got {args.memory_limit}")
    if args.verify < 0:
        raise SpecError("--verify", f"must be >= 0 (candidates to run), got {args.verify}")
    if args.verify:
        whole("--steps", args.steps)
        whole("--warmup", args.warmup, 0)
    if args.out is not None:
        if not args.out.endswith((".yaml", ".yml")):
            raise SpecError("--out", f"must name a .yaml file, got {args.out!r}")
        output_file("--out", args.out, inputs=(args.recipe, *args.profile))


def load(path: str, overrides) -> "Recipe":
    """The recipe with ``--set`` applied; a key neither in the recipe nor read by the loader is refused."""
    raw = load_raw(path)
    for item in overrides:
        check_override_key(raw, item, READ_KEYS, ("mpipe.profile",))
    return load_parsed(path, list(overrides))


def profiles(paths) -> dict:
    """``{path: ModelProfile}`` of the ``--profile`` files (each a file with an ``mpipe.profile`` mapping)."""
    out = {}
    for path in paths:
        if not os.path.isfile(path):
            raise SpecError("--profile", f"file not found: {path}")
        raw = load_raw(path)
        prof = (raw.get("mpipe") or {}).get("profile") if isinstance(raw.get("mpipe"), dict) else None
        if not isinstance(prof, dict):
            raise SpecError("--profile", f"{path} has no mpipe.profile mapping")
        out[path] = parse_profile(prof, where=f"--profile {path}: mpipe.profile")
    return out


def own_schedule(space: Space) -> dict:
    """The recipe's own schedule, at its own V and M, through the same chain."""
    recipe = space.recipe
    try:
        plan = checked_plan(recipe)
    except (SpecError, PlanError) as e:
        return {"schedule": str(recipe.schedule), "refused": str(e).splitlines()[0]}
    spill = any(x.get("spill") == "next_step" for x in plan.schedule)
    rep = simulate(plan, space.profile_at(space.M0), steps=3 if spill else 1)
    peaks = [d.peak_memory_mb for d in rep.devices]
    return {"schedule": plan.meta["schedule_name"], "V": space.V0, "M": space.M0,
            "layers": [c.layers for c in plan.chunks if c.region == space.body.name],
            "step_ms": rep.step_ms, "bubble_ratio": rep.bubble_ratio, "peak_mb": max(peaks),
            "peak_device": peaks.index(max(peaks))}


def candidate_json(space: Space, rank: int, s: Scored) -> dict:
    c = s.cand
    sizes = space.batch.sizes(c.M) or {}
    return {"rank": rank, "schedule": s.name, "spec": space.schedule(c).to_list(), "V": c.V, "M": c.M,
            "micro_batch_size": space.batch.samples // c.M, "batch_keys": sizes, "layers": list(c.layers),
            "offset": space.offset(c), "split": c.split, "step_ms": round(s.step_ms, 6),
            "bubble_ratio": round(s.bubble, 6), "peak_memory_mb": [round(x, 3) for x in s.peaks_mb],
            "peak_mb": round(s.peak_mb, 3), "peak_device": s.peak_device, "keys": space.keys(c),
            "same_plan": list(s.same_plan), "T": c.T, "recompute": c.recompute or "recipe"}


def result_json(args, space: Space, out: Outcome, own: dict) -> dict:
    counts = {k: out.counts.get(k, 0) for k in ("searched", "derived", "kept", "same_plan", "time_bound",
                                               "memory_bound", "memory", "refused", "body_bounds")}
    return {"recipe": args.recipe, "command": "hyperparallel " + " ".join(sys.argv[1:]),
            "overrides": list(args.overrides), "profiles": {
                str(p.micro_batch_size or space.batch.size0): f for f, p in
                ([("recipe", space.recipe.profile)] + list(space.profile_files.items()))},
            "memory_limit_gb": args.memory_limit,
            "top": args.top, "batch": space.batch.to_json(), "space": space.describe(), "counts": counts,
            "refused": dict(out.refused), "seconds": round(out.seconds, 3),
            "cpu_seconds": round(out.cpu_seconds, 3),
            "candidates": [candidate_json(space, i + 1, s) for i, s in enumerate(out.table)],
            "recipe_schedule": own, "out": args.out}


NOISE_HINT = "within the profile's noise: measure with `tune --verify`"


def spread_json(space: Space) -> Optional[dict]:
    """The largest spread over the repeats of any profile tune reads (the recipe's, each ``--profile``):
    ``{"spread", "cost", "profile", "repeats"}``; None when none records one (hand-written, one repeat)."""
    best = None
    for name, p in [("recipe", space.recipe.profile)] + list(space.profile_files.items()):
        got = profile_spread(p)
        if got is not None and (best is None or got[0] > best["spread"]):
            best = {"spread": got[0], "cost": got[1], "profile": name, "repeats": p.repeats}
    return best


def margin_json(out: Outcome, own: dict) -> Optional[dict]:
    """Rank 1's predicted margin: over the recipe's own schedule when that is slower, else over rank 2;
    ``{"over", "margin"}`` with margin = (their step_ms - rank 1's) / rank 1's. None when there is neither."""
    best = out.ranked[0]
    if "refused" not in own and own["step_ms"] > best.step_ms * (1 + 1e-9):
        return {"over": "recipe_schedule", "margin": round((own["step_ms"] - best.step_ms) / best.step_ms, 6)}
    if len(out.ranked) > 1:
        return {"over": "rank 2", "margin": round((out.ranked[1].step_ms - best.step_ms) / best.step_ms, 6)}
    return None


def noise_lines(spread: Optional[dict], margin: Optional[dict]) -> list:
    """The profile's spread, and a warning when rank 1's margin is smaller than it."""
    if spread is None:
        return []
    reps = f" over {spread['repeats']} repeats" if spread["repeats"] else ""
    lines = [f"profile spread{reps}: up to {spread['spread']:.1%} ({spread['cost']}, {spread['profile']} profile; "
             "(max - min) / median of a per-layer cost)"]
    if margin is not None and margin["margin"] < spread["spread"]:
        over = "the recipe's own schedule" if margin["over"] == "recipe_schedule" else "rank 2"
        lines.append(f"rank 1's predicted margin over {over} is {margin['margin']:.1%}, smaller than the profile's "
                     f"spread {spread['spread']:.1%}: {NOISE_HINT}")
    return lines


def _no_candidate(space: Space, out: Outcome, limit_mb: Optional[float]) -> SpecError:
    if limit_mb is not None and out.counts.get("memory", 0) + out.counts.get("memory_bound", 0):
        lp = lowest_peak(space)   # over the whole space: the search derived only what its bounds let through
        if lp is not None:
            return SpecError("--memory-limit", f"no candidate fits {limit_mb / GB:g} GB; the smallest predicted peak "
                                               f"is {memory(lp.peak_mb)} on device {lp.peak_device} ({lp.name}, "
                                               f"V={lp.cand.V}, M={lp.cand.M})")
    if out.first_refusal is not None:
        return SpecError("recipe", f"no candidate could be planned; the first refusal: {out.first_refusal}")
    return SpecError("recipe", "the search space is empty")


def _batch_line(space: Space) -> str:
    b = space.batch
    if b.keys:
        keys = ", ".join(f"{k}={v}" for k, v in b.keys)
        how = f"micro-batch size from {keys}; at M the keys become {b.samples} / M"
    else:
        how = "the recipe gives no micro-batch size key: one sample per micro-batch assumed, costs scaled by it"
    if b.fixed:
        how += f"; M held at {b.M0}: {b.fixed}"
    return (f"global batch {b.samples} samples per data-parallel replica = micro_batch_num {b.M0} x micro-batch "
            f"size {b.size0} ({how})")


def _space_lines(space: Space, out: Outcome) -> list:
    d = space.describe()
    by_v = "; ".join(f"V={v}: {', '.join(o)}" for v, o in d["orders_by_V"].items())
    c = out.counts
    dropped = [f"{c.get('time_bound', 0)} by the time bound", f"{c.get('memory_bound', 0)} by the memory bound"]
    derived = (f"derived {c.get('derived', 0)} (kept {c.get('kept', 0)}, the same plan as a kept spelling "
               f"{c.get('same_plan', 0)}, over the memory limit {c.get('memory', 0)}, "
               f"refused {c.get('refused', 0)}"
               + (f": {', '.join(f'{k} {v}' for k, v in out.refused.items())}" if out.refused else "") + ")")
    return [f"space: orders ({by_v}) x M in {{{', '.join(map(str, d['M']))}}} x {len(d['encoders'])} encoder "
            f"placement(s) x layer splits = {d['families']} families, {d['base_candidates']} base candidates; "
            f"refinement moves add the rest",
            f"searched {c.get('searched', 0)}: {derived}; not derived: {', '.join(dropped)} "
            f"({c.get('body_bounds', 0)} LLM-alone bounds derived); {out.seconds:.1f} s "
            f"({out.cpu_seconds:.1f} s CPU)"]


def _table(space: Space, out: Outcome) -> str:
    rows = []
    for i, s in enumerate(out.table):
        c = s.cand
        rows.append([i + 1, s.name, c.V, c.M, space.batch.samples // c.M, json.dumps(space.offset(c)),
                     f"{s.step_ms:.2f}", f"{s.bubble:.3f}", f"{memory(s.peak_mb)} (device {s.peak_device})"]
                    + ([c.T] if len(space.Ts) > 1 else []))
    return text_table(["rank", "schedule", "V", "M", "mbs", "offset", "step_ms", "bubble", "peak memory"]
                      + (["T"] if len(space.Ts) > 1 else []), rows)


#: the largest T tune tries: a stage's T ranks are neighbours in one node (8 NPUs on Ascend)
MAX_TUNE_T = 8


def levers(recipe) -> tuple:
    """The memory levers ``--memory-limit`` searches: (the T values the model's adapter can split its
    language model into, 1..MAX_TUNE_T, or the recipe's T alone for a model with no runtime adapter;
    the LLM's recompute: the recipe's own (None), ``none`` and ``full``)."""
    from ..models import adapter_for
    from ..errors import SpecError
    ts = [recipe.tensor_parallel]
    try:
        model = adapter_for(recipe.raw.get("model"), {}, 0)
    except Exception:   # noqa: BLE001 - no adapter built from the section alone: the recipe's T only
        model = None
    if model is not None:
        for t in range(1, MAX_TUNE_T + 1):
            try:
                model.check_tensor_parallel(t)
            except SpecError:
                continue
            ts.append(t)
    own = recipe.recompute[1] if recipe.recompute else "none"
    own = "full" if own is True else own
    recs = (None,) + tuple(r for r in ("none", "full") if r != own)
    return tuple(sorted(set(ts))), recs


def memory(mb: float) -> str:
    """A peak in GB (1000 MB) from 1 GB up, else in MB."""
    return f"{mb / GB:.2f} GB" if mb >= GB else f"{mb:.2f} MB"


def run(args) -> int:
    _check_args(args)
    recipe = load(args.recipe, args.overrides)
    ts, recs = levers(recipe) if args.memory_limit is not None else ((), (None,))
    space = Space(recipe, profiles=profiles(args.profile), tensor_parallel=ts, recompute=recs)
    limit = None if args.memory_limit is None else args.memory_limit * GB
    out = search(space, limit, args.top)
    if not out.ranked:
        raise _no_candidate(space, out, limit)
    own = own_schedule(space)
    result = result_json(args, space, out, own)
    spread, margin = spread_json(space), margin_json(out, own)
    result.update(profile_spread=spread, margin=margin,
                  within_noise=None if spread is None or margin is None else margin["margin"] < spread["spread"])
    best = out.ranked[0]
    if args.out:
        header = [f"Written by: hyperparallel {' '.join(sys.argv[1:])}",
                  f"rank 1 of {out.counts['kept']} kept ({out.counts['searched']} searched): {best.name}, V={best.cand.V}, "
                  f"M={best.cand.M}, LLM layers per chunk {list(best.cand.layers)}",
                  f"predicted step {best.step_ms:.2f} ms, bubble {best.bubble:.3f}, peak memory "
                  f"{memory(best.peak_mb)} on device {best.peak_device} (the cost model, the recipe's profile)",
                  f"layer split for your own MindFormers YAML: {offset_line(space, best)}",
                  f"global batch kept: {space.batch.samples} samples per data-parallel replica "
                  f"= {best.cand.M} x {space.batch.samples // best.cand.M}"]
        write_text(args.out, overlay_text(space, best, args.out, header))   # whole, or not at all
    if args.verify:
        from ..bench.verify import verify
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            code, ver = verify(args, space, out, args.verify)
        result["verify"] = ver
        if code:
            if args.json:
                print(json.dumps(result, indent=1))
            return code
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"tune {args.recipe}: P={space.P} D={space.D}; {_batch_line(space)}")
    for line in _space_lines(space, out):
        print(line)
    print(_table(space, out))
    for i, s in enumerate(out.table):
        if s.same_plan:
            print(f"rank {i + 1} is also spelled (the same plan): {'; '.join(s.same_plan)}")
    if "refused" in own:
        print(f"recipe's own schedule {own['schedule']}: refused: {own['refused']}")
    else:
        print(f"recipe's own schedule {own['schedule']} (V={own['V']}, M={own['M']}): {own['step_ms']:.2f} ms, "
              f"peak {memory(own['peak_mb'])}; rank 1 is {own['step_ms'] / best.step_ms:.2f}x faster")
    for line in noise_lines(spread, margin):
        print(line)
    print(f"rank 1's layer split as MindFormers' offset: {offset_line(space, best)}")
    if args.out:
        print(f"wrote {args.out}")
    if args.verify:
        from ..bench.verify import format_verify
        print(format_verify(result["verify"]))
    return 0
