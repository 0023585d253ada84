"""``hyperparallel profile RECIPE``: measure the recipe's per-layer costs and the link on this machine.

Every rank times every chunk of the recipe's cut through the rank runtime on a one-device program
(the tight loop, :mod:`.ranks.measure`), ranks 0 and 1 ping-pong; :func:`build_profile` turns that into an
``mpipe.profile`` block. ``--in-pipeline`` then takes the compute costs from a real run of a
reference schedule with every action timed (:func:`apply_pipeline_costs`, :func:`runtime_overheads`).
The output is a recipe inheriting the measured one (``base_config``) with its own ``mpipe.profile``.
How each figure is measured: ``docs/bench.md``.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import platform
import shlex
import sys
from typing import Dict, List, Tuple

import yaml

from ..errors import SpecError, whole
from ..util import median, output_file, write_text

DEFAULT_REFERENCE = "gpipe"  # reference schedule of an in-pipeline profile
PIPELINE_KINDS = ("F", "B", "W", "BW")  # compute actions whose in-pipeline times set the costs
BENCH_WORKER = "hyperparallel.bench.ranks.worker"   # the msrun entry (a module: launch runs python -m it)


def prepare(args):
    """Recipe, run config and plan, all checked before anything is launched (SpecError/PlanError)."""
    from ..recipe import checked_plan
    from ..runconfig import load_parsed

    from ..launch import preflight
    recipe = load_parsed(args.recipe, args.overrides)
    preflight(recipe.pipeline_stage * recipe.data_parallel, recipe.device)
    rc = recipe.run
    from ..launch import refuse_tensor_parallel
    refuse_tensor_parallel(recipe, "hyperparallel profile")
    for line in rc.model.notes():   # said once here, before launch; the ranks build the same model silently
        print(f"note: {line}", flush=True)
    sched = args.schedule
    if getattr(args, "in_pipeline", False) and sched is None:
        sched = DEFAULT_REFERENCE
    plan = checked_plan(recipe, sched)
    whole("--samples", args.samples)
    whole("--repeats", args.repeats)
    if plan.num_devices * plan.data_parallel < 2:
        raise SpecError("parallel_config.pipeline_stage", "profile needs >= 2 ranks (the link is measured between two)")
    output_file("--out", args.out or default_out(args.recipe), inputs=(args.recipe,))   # before the measuring
    return recipe, rc, plan


def _mean(xs: List[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def per_layer_and_head(chunks, ms: List[float]) -> tuple:
    """(ms per layer, ms of the head) of one region from its chunks' times, chunks in data-flow
    order: the chunks before the last give the per-layer cost, the last chunk's excess over its
    layers is the head (an LLM's output head and loss, an encoder's projector). One chunk: no
    head can be told apart (its whole time is per layer, exact for that chunk)."""
    L = sum(c.layers for c in chunks)
    if len(chunks) < 2:
        return (sum(ms) / L if L else 0.0), 0.0
    per = sum(ms[:-1]) / sum(c.layers for c in chunks[:-1])
    return per, max(0.0, ms[-1] - per * chunks[-1].layers)


def action_means(ranks: List[dict], value=lambda a: a["ms"]) -> Dict[tuple, float]:
    """{(mode, kind, region, chunk): the mean over ranks, steps and micro-batches of ``value(action)``}."""
    per: Dict[tuple, List[float]] = {}
    for res in ranks:
        for a in res["actions"]:
            per.setdefault((a["mode"], a["kind"], a["region"], a["chunk"]), []).append(value(a))
    return {k: _mean(v) for k, v in per.items()}


def region_costs(recipe, plan, t: Dict[tuple, float], data_ms: float) -> Dict[str, Dict[str, float]]:
    """Per region, the per-layer and head costs (``forward_ms`` .. ``head_weight_ms``, before the
    trainable mask) from the chunks' mean action times ``t`` (:func:`action_means`)."""
    out = {}
    last = recipe.profile.regions[-1].name
    for r in recipe.profile.regions:
        chunks = [c for c in plan.chunks if c.region == r.name]
        L = sum(c.layers for c in chunks)
        f = [t.get(("fused", "F", r.name, c.index), 0.0) for c in chunks]
        bw = [t.get(("fused", "BW", r.name, c.index), 0.0) for c in chunks]
        b = [t.get(("split", "B", r.name, c.index), 0.0) for c in chunks]
        w = [max(0.0, x - y) for x, y in zip(bw, b)]
        (f_l, f_h), (b_l, b_h), (w_l, w_h) = (per_layer_and_head(chunks, v) for v in (f, b, w))
        if r.name == last:
            f_l += data_ms * plan.num_devices / L
        out[r.name] = {"forward_ms": f_l, "backward_ms": b_l, "weight_ms": w_l, "head_forward_ms": f_h,
                       "head_backward_ms": b_h, "head_weight_ms": w_h}
    return out


def cost_spread(recipe, plan, ranks: List[dict], data_ms: float) -> Tuple[int, Dict[str, Dict[str, float]]]:
    """(repeats, per region {cost: (max - min) / median over the repeats}) of the compute costs, each
    repeat's costs built from that pass's action times (``passes_ms``); (n, {}) with fewer than 2
    repeats recorded. How much the costs moved while measured: a busy machine shows here."""
    lens = [len(a.get("passes_ms") or ()) for res in ranks for a in res["actions"]]
    n = min(lens) if lens else 0
    if n < 2:
        return n, {}
    runs = [region_costs(recipe, plan, action_means(ranks, lambda a, p=p: a["passes_ms"][p]), data_ms)
            for p in range(n)]
    out: Dict[str, Dict[str, float]] = {}
    for r in recipe.profile.regions:
        trainable = r.trainable
        for key in runs[0][r.name]:
            if not trainable and key not in ("forward_ms", "head_forward_ms"):
                continue
            xs = [run[r.name][key] for run in runs]
            mid = median(xs)
            if mid > 0:
                out.setdefault(r.name, {})[key] = round((max(xs) - min(xs)) / mid, 4)
    return n, out


def build_profile(recipe, plan, ranks: List[dict]) -> dict:
    """The ``mpipe.profile`` mapping from the per-rank measurements (see module docstring)."""
    t = action_means(ranks)
    data_ms = _mean([x for r in ranks for x in r["data_ms"]])
    costs = region_costs(recipe, plan, t, data_ms)
    repeats, spread = cost_spread(recipe, plan, ranks, data_ms)
    regions = []
    for r in recipe.profile.regions:
        chunks = [c for c in plan.chunks if c.region == r.name]
        L = sum(c.layers for c in chunks)
        c = costs[r.name]
        f_l, b_l, w_l = c["forward_ms"], c["backward_ms"], c["weight_ms"]
        f_h, b_h, w_h = c["head_forward_ms"], c["head_backward_ms"], c["head_weight_ms"]
        act = _mean([sum(res["activation_mb"].get(f"{r.name}/{c.index}", 0.0) for c in chunks) for res in ranks])
        par = sum(ranks[0]["param_mb"][f"{r.name}/{c.index}"] for c in chunks)
        out = ranks[0]["output_mb"].get(r.name, r.output_mb)
        tr = 1.0 if r.trainable else 0.0
        reg = dict(name=r.name, layers=r.layers, trainable=r.trainable, forward_ms=round(f_l, 4),
                   backward_ms=round(b_l * tr, 4), weight_ms=round(w_l * tr, 4),
                   activation_mb=round(act / L, 4), output_mb=round(out, 5), param_mb=round(par / L, 5))
        whole = ranks[0].get("whole_param_mb", {})
        if any(f"{r.name}/{c.index}" in whole for c in chunks):   # the part tensor parallelism keeps whole
            reg["whole_param_mb"] = round(sum(whole.get(f"{r.name}/{c.index}", ranks[0]["param_mb"][f"{r.name}/{c.index}"])
                                              for c in chunks) / L, 5)
        if len(chunks) > 1:
            reg.update(head_forward_ms=round(f_h, 4), head_backward_ms=round(b_h * tr, 4),
                       head_weight_ms=round(w_h * tr, 4))
        if spread.get(r.name):   # only the costs the region has (no head cost of a one-chunk region)
            reg["spread"] = {k: v for k, v in spread[r.name].items() if k in reg}
        regions.append(reg)
    link = next((res["link"] for res in ranks if res.get("link")), None) or {}
    opt = recipe.raw.get("train", {}).get("optimizer", "adam")
    block = {"link": {"latency_ms": round(link.get("latency_ms", 0.0), 4),
                     "bandwidth_gb_s": round(link.get("bandwidth_gb_s", 0.0), 4)},
            "optimizer_factor": 2.0 if opt == "adam" else 1.0,
            "regions": regions}
    mbs = (recipe.raw.get("data") or {}).get("micro_batch_size") if isinstance(recipe.raw.get("data"), dict) else None
    if isinstance(mbs, int) and not isinstance(mbs, bool):
        block["micro_batch_size"] = mbs   # the size these per-micro-batch costs belong to (read by tune)
    if ranks and ranks[0].get("machine"):
        block["measured_on"] = dict(ranks[0]["machine"])
    if spread:
        block["repeats"] = repeats   # the measurements each region's ``spread`` is over
    scale = device_scale(ranks, plan.num_devices, plan.data_parallel)
    if scale:
        block["device_scale"] = scale
    return block


def device_scale(ranks: List[dict], P: int, D: int = 1) -> List[float]:
    """Per pipeline device, its ranks' time for the same work over the mean of all ranks: every rank
    times every chunk (the tight loop), so the ratio is the device's speed, not its share of the model
    (the cores of a VM can differ by tens of percent). [] with fewer than two ranks."""
    if len(ranks) < 2:
        return []
    keys = None
    per_rank = {}
    for i, res in enumerate(ranks):
        t = {(a["kind"], a["region"], a["chunk"], a.get("step"), a["micro"]): a["ms"]
             for a in res["actions"] if a["mode"] == "fused"}
        per_rank[res.get("rank", i)] = t
        keys = set(t) if keys is None else keys & set(t)
    totals = {r: sum(t[k] for k in keys) for r, t in per_rank.items()}
    mean = sum(totals.values()) / len(totals)
    if mean <= 0:
        return []
    return [round(_mean([totals[r] for r in totals if r // max(1, D) == d]) / mean, 4) for d in range(P)]


def pipeline_action_medians(launches: List[List[dict]], warmup: int) -> Dict[tuple, List[float]]:
    """In-pipeline compute times of a reference-schedule run, per (kind, region, chunk): every
    F/B/W/BW action of every kept step (index >= ``warmup``) of every rank of every launch
    (``bench`` results with ``action_times``). Returns ``{(kind, region, chunk): [ms, ...]}``."""
    per: Dict[tuple, List[float]] = {}
    for ranks in launches:
        for res in ranks:
            for a in res.get("action_times") or []:
                if a["step"] >= warmup and a["kind"] in PIPELINE_KINDS:
                    per.setdefault((a["kind"], a["region"], a["chunk"]), []).append(float(a["ms"]))
    return per


def apply_pipeline_costs(block: dict, plan, times: Dict[tuple, List[float]], data_ms: float) -> dict:
    """``block`` (a :func:`build_profile` result) with each region's compute costs replaced by the
    medians of the in-pipeline times (:func:`pipeline_action_medians`) of ``plan`` (the reference
    schedule's plan): per region, the sum over its chunks of the chunk's median time / the
    region's layers, each chunk's time first divided by the ``device_scale`` of the device that ran
    it (a slow device's time is not the chunk's cost). ``forward_ms`` gets the data-generation charge ``data_ms x P / layers`` on
    the last region, as :func:`build_profile` does. A trainable region's backward: the measured
    B and W when the reference runs them split, else the fused BW split in the tight loop's
    B : (BW - B) proportion (half each without one). A cost the reference did not run (a chunk
    missing) keeps the tight-loop value. Returns a new block."""
    out = copy.deepcopy(block)
    P = plan.num_devices
    last = out["regions"][-1]["name"]

    scale = out.get("device_scale") or []

    def speed(c) -> float:   # the measured time on c's devices, over the time at mean speed
        if not scale:
            return 1.0
        return _mean([scale[d] for d in c.devices if d < len(scale)]) or 1.0

    def split(kind, chunks):   # (per layer, head) from the chunks' median times, or None
        vals = [times.get((kind, c.region, c.index)) for c in chunks]
        if not chunks or any(not v for v in vals):
            return None
        return per_layer_and_head(chunks, [median(v) / speed(c) for c, v in zip(chunks, vals)])

    for reg in out["regions"]:
        chunks = [c for c in plan.chunks if c.region == reg["name"]]
        L = sum(c.layers for c in chunks) or reg["layers"]
        heads = len(chunks) > 1
        f = split("F", chunks)
        if f is not None:
            reg["forward_ms"] = round(f[0] + (data_ms * P / L if reg["name"] == last else 0.0), 4)
            if heads:
                reg["head_forward_ms"] = round(f[1], 4)
        if not reg["trainable"]:
            continue
        b, w, bw = split("B", chunks), split("W", chunks), split("BW", chunks)
        if b is not None and w is not None:
            reg["backward_ms"], reg["weight_ms"] = round(b[0], 4), round(w[0], 4)
            if heads:
                reg["head_backward_ms"], reg["head_weight_ms"] = round(b[1], 4), round(w[1], 4)
        elif bw is not None:
            tb, tw = reg["backward_ms"], reg["weight_ms"]
            frac = tb / (tb + tw) if tb + tw > 0 else 0.5
            reg["backward_ms"], reg["weight_ms"] = round(bw[0] * frac, 4), round(bw[0] * (1.0 - frac), 4)
            if heads:
                reg["head_backward_ms"], reg["head_weight_ms"] = round(bw[1] * frac, 4), round(bw[1] * (1 - frac), 4)
    return out


def runtime_overheads(launches: List[List[dict]], plan, warmup: int) -> Dict[str, float]:
    """The runtime's own time in a reference run, for the cost model: ``action_overhead_ms``, the
    host work per compute action (the interpreter and the gradient adds: a rank's ``interp_s +
    accumulate_s`` over its compute actions, median over ranks and kept steps), and
    ``step_overhead_ms``, the optimizer update and loss all-reduce after the programs (per step the
    least over ranks, as the all-reduce includes waiting for the slowest; median over steps)."""
    from ..mpipe import ir
    per_action, per_step = [], []
    for ranks in launches:
        by_step: Dict[int, List[float]] = {}
        for res in ranks:
            n = sum(1 for a in plan.programs.get(res.get("device", 0), []) if a.kind in ir.COMPUTE_KINDS)
            for st in res["steps"]:
                if st["step"] < warmup:
                    continue
                if n:
                    per_action.append((st["interp_s"] + st.get("accumulate_s", 0.0)) / n * 1e3)
                by_step.setdefault(st["step"], []).append((st["optimizer_s"] + st["loss_reduce_s"]) * 1e3)
        per_step += [min(v) for v in by_step.values()]
    return {"action_overhead_ms": round(median(per_action), 4) if per_action else 0.0,
            "step_overhead_ms": round(median(per_step), 4) if per_step else 0.0}


def pipeline_lines(schedule: str, times: Dict[tuple, List[float]]) -> List[str]:
    """The in-pipeline medians, written as comments next to the profile."""
    lines = [f"compute costs from in-pipeline action times of a {schedule} run (median per action):"]
    for (kind, region, chunk), v in sorted(times.items()):
        lines.append(f"in-pipeline {kind:2s} {region} c{chunk}: median {median(v):.3f} ms over {len(v)}")
    return lines


def mean_data_ms(ranks: List[dict]) -> float:
    return _mean([x for r in ranks for x in r["data_ms"]])


def summary_lines(plan, ranks: List[dict]) -> List[str]:
    """Raw numbers worth keeping next to the profile (written as comments)."""
    outs = {reg: [x for r in ranks for x in r["output_bytes"][reg]] for reg in plan.regions()}
    n = len(next(iter(outs.values()), [])) // max(1, len(ranks))
    sizes = ", ".join(f"{reg} {_mean(v) / 2 ** 20:.4f} MB" for reg, v in outs.items())
    lines = [f"ranks: {len(ranks)}, micro-batches timed per rank: {n}, mean output per micro-batch: {sizes}",
             f"data generation per micro-batch: {_mean([x for r in ranks for x in r['data_ms']]):.3f} ms "
             f"(added to the last region's forward_ms as data_ms x P / layers, P={plan.num_devices})"]
    per: Dict[tuple, List[float]] = {}
    for res in ranks:
        for a in res["actions"]:
            per.setdefault((a["mode"], a["kind"], a["region"], a["chunk"]), []).append(a["ms"])
    for (mode, kind, region, chunk), v in sorted(per.items()):
        lines.append(f"{mode:5s} {kind:2s} {region} c{chunk}: mean {_mean(v):.3f} ms over {len(v)}")
    link = next((res["link"] for res in ranks if res.get("link")), None)
    if link:
        for p in link["points"]:
            lines.append(f"ping-pong {p['bytes']} B: one-way {p['one_way_ms']:.3f} ms, "
                         f"send returns after {p['send_host_ms']:.3f} ms")
    return lines


def default_out(recipe_path: str) -> str:
    stem, _ = os.path.splitext(recipe_path)
    return stem + ".profile.yaml"


def write_profile(path: str, recipe_path: str, block: dict, comments: List[str], argv: List[str]) -> None:
    rel = os.path.relpath(os.path.abspath(recipe_path), os.path.dirname(os.path.abspath(path)))
    head = [f"# Measured by: hyperparallel {' '.join(shlex.quote(a) for a in argv)}",
            f"# on {platform.node()} ({os.cpu_count()} cores), "
            f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"]
    head += [f"#   {c}" for c in comments]
    head += ["# Use: hyperparallel simulate|bench THIS_FILE, or hyperparallel bench RECIPE --profile THIS_FILE"]
    body = yaml.safe_dump({"base_config": rel, "mpipe": {"profile": block}}, sort_keys=False,
                          default_flow_style=None, width=120)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text(path, "\n".join(head) + "\n" + body)


def profile_job(recipe, rc, plan, samples: int, passes: int, out_dir: str) -> dict:
    return {"mode": "profile", "device": rc.device, "raw": recipe.raw, "plan": plan.to_json(),
            "data_parallel": plan.data_parallel, "steps": samples, "warmup": 2, "passes": passes,
            "out_dir": out_dir}


def reference_job(recipe, rc, plan, schedule: str, steps: int, out_dir: str) -> dict:
    """A ``bench`` job running the reference schedule's real programs with every action timed."""
    return {"mode": "bench", "device": rc.device, "name": f"reference {schedule}", "schedule": schedule,
            "raw": recipe.raw, "plan": plan.to_json(), "data_parallel": plan.data_parallel, "steps": steps,
            "out_dir": out_dir, "action_times": True}


REFERENCE_WARMUP = 2  # steps of a reference run whose action times are discarded


def read_ranks(out_dir: str, world: int) -> List[dict]:
    ranks = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank_{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def merge_rounds(rounds: List[List[dict]]) -> List[dict]:
    """Per-rank measurements of several profile launches merged into one set: for every timed
    (action, step, micro-batch), data generation, activation and the link, the median over the
    launches (``hyperparallel bench --measure-profile`` interleaves them with the schedules); each
    action's ``passes_ms`` becomes its time in each launch (the repeats :func:`cost_spread` reads)."""
    if len(rounds) == 1:
        return rounds[0]
    merged = []
    for r in range(len(rounds[0])):
        runs = [rd[r] for rd in rounds]
        per: Dict[tuple, List[float]] = {}
        for res in runs:
            for a in res["actions"]:
                key = (a["mode"], a["kind"], a["region"], a["chunk"], a.get("step"), a["micro"])
                per.setdefault(key, []).append(a["ms"])
        actions = [dict(mode=k[0], kind=k[1], region=k[2], chunk=k[3], step=k[4], micro=k[5], ms=median(v),
                        passes_ms=list(v))   # one time per launch: the profile's spread is over the launches
                   for k, v in per.items()]
        n = min(len(res["data_ms"]) for res in runs)
        data = [median([res["data_ms"][i] for res in runs]) for i in range(n)]
        act = {k: median([res["activation_mb"][k] for res in runs]) for k in runs[0]["activation_mb"]}
        links = [res["link"] for res in runs if res.get("link")]
        link = None
        if links:
            link = {"latency_ms": median([x["latency_ms"] for x in links]),
                    "bandwidth_gb_s": median([x["bandwidth_gb_s"] for x in links]),
                    "points": links[len(links) // 2]["points"]}
        merged.append(dict(runs[0], actions=actions, data_ms=data, activation_mb=act, link=link))
    return merged


def measured_profile(recipe, plan, rounds: List[List[dict]], reference=None):
    """(the ``mpipe.profile`` block, comments for its file) from tight-loop measurements of ``plan``'s cut
    (``rounds``: one per launch, merged by :func:`merge_rounds`) and, with ``reference`` =
    ``(reference plan, launches, schedule, warm-up steps)``, the compute costs and runtime overheads
    of the reference schedule's real runs (:func:`apply_pipeline_costs`, :func:`runtime_overheads`).
    ``hyperparallel profile`` and ``hyperparallel bench`` both build their profile here."""
    merged = merge_rounds(rounds)
    block = build_profile(recipe, plan, merged)
    comments = [f"median over {len(rounds)} profile measurements, one per repeat of the bench"] if len(rounds) > 1 \
        else []
    if reference is not None:
        ref_plan, launches, schedule, warmup = reference
        times = pipeline_action_medians(launches, warmup)
        block = apply_pipeline_costs(block, ref_plan, times, mean_data_ms(merged))
        block.update(runtime_overheads(launches, ref_plan, warmup))
        comments += pipeline_lines(schedule, times)
    return block, comments + summary_lines(plan, merged)


def run(args) -> int:
    from ..errors import PlanError
    from ..util import error, slug
    try:
        recipe, rc, plan = prepare(args)
    except (SpecError, PlanError) as e:
        return error(str(e).splitlines()[0])
    out = args.out or default_out(args.recipe)
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = os.path.abspath(args.run_dir or os.path.join("runs", slug(f"profile_{stem}")))
    world = plan.num_devices * plan.data_parallel
    job = profile_job(recipe, rc, plan, args.samples, args.repeats, os.path.join(run_dir, "result"))
    print(f"profile {stem}: {len(plan.chunks)} chunks x {plan.num_micro} micro-batches x {args.samples} steps "
          f"on {world} {rc.device} ranks; run dir {run_dir}", flush=True)
    from ..launch import launch
    res = launch(job, world, os.path.join(run_dir, "logs"), timeout_s=args.timeout, script=BENCH_WORKER)
    if res.returncode != 0:
        print(f"error: job failed (exit {res.returncode}): {res.message}", file=sys.stderr)
        return res.returncode
    reference = None
    if args.in_pipeline:
        sched = args.schedule or DEFAULT_REFERENCE
        ref = reference_job(recipe, rc, plan, sched, REFERENCE_WARMUP + args.samples,
                            os.path.join(run_dir, "reference", "result"))
        print(f"in-pipeline: {sched} on {world} ranks, {REFERENCE_WARMUP} warm-up + {args.samples} steps, "
              f"every action timed", flush=True)
        res = launch(ref, world, os.path.join(run_dir, "reference", "logs"), timeout_s=args.timeout,
                     script=BENCH_WORKER)
        if res.returncode != 0:
            print(f"error: reference run failed (exit {res.returncode}): {res.message}", file=sys.stderr)
            return res.returncode
        reference = (plan, [read_ranks(ref["out_dir"], world)], sched, REFERENCE_WARMUP)
    block, comments = measured_profile(recipe, plan, [read_ranks(job["out_dir"], world)], reference)
    write_profile(out, args.recipe, block, comments, sys.argv[1:])
    for c in comments:
        print(c)
    print(yaml.safe_dump({"mpipe": {"profile": block}}, sort_keys=False, default_flow_style=None, width=120))
    print(f"wrote {out}")
    return 0
