"""``hyperparallel simulate``: compare schedules with the cost model (table or JSON, trace, PNG).

One schedule with ``--json`` prints one object (``makespan_ms``, ``bubble_ratio``, ``devices``:
``[{device, busy_ms, peak_activation_mb, peak_memory_mb, params_mb, grads_mb, optimizer_mb,
peak_held, peak_held_total}]``, ...); several print a table, or with
``--json`` a list of such objects, each with its ``speedup`` against the first. With
``mpipe.memory_limit_gb`` each object has ``memory_limit_exceeded`` (the devices over it, worst
first, with their predicted peak and its parts) and a warning line goes to stderr per plan over it. With
ZeRO (``train.zero``, or ``parallel_config.optimizer_shard: true``: level 1) each has ``zero`` ({level, key,
line}) and the table is preceded by that line.
"""
from __future__ import annotations

import json
import math
import sys

from ..mpipe import bounds
from ..mpipe.cost import simulate
from ..errors import SpecError, whole
from ..mpipe.table import text_table
from ..recipe import checked_plan, memory_excess, memory_warning, steady_steps
from ..runconfig import load_parsed
from ..util import output_file


def run_simulate(args) -> int:
    if getattr(args, "data_steps", None) is not None:
        from .replay import run_replay
        return run_replay(args)
    for s in args.schedule or []:
        if isinstance(s, str) and "|" in s:
            raise SpecError("--schedule", f"{s!r}: settings after '|' are read by --data-steps and bench only (the "
                                          "plain cost model does not read the data)")
    if args.trace:
        output_file("--trace", args.trace, inputs=(args.recipe,))
    if args.png:
        output_file("--png", args.png, (".png", ".svg", ".pdf"), inputs=(args.recipe,))
    if args.steps is not None:
        whole("--steps", args.steps)
        bounds.at_most("--steps", args.steps, bounds.MAX_SIM_STEPS, "(the steady state shows after 3 steps)")
    recipe = load_parsed(args.recipe, args.overrides)
    from .plan import check_generated_data, check_tensor_parallel
    check_generated_data(recipe)
    check_tensor_parallel(recipe)
    schedules = args.schedule or [None]
    plans = [checked_plan(recipe, s) for s in schedules]
    # next-step spill only shows in the steady state: then every schedule runs the same steps
    steps = args.steps or steady_steps(plans)
    for plan in plans:
        runs = steps * sum(len(p) for p in plan.programs.values())
        if runs > bounds.MAX_SIM_RUNS:
            raise SpecError("--steps", f"{steps} steps x {runs // steps:,} actions = {runs:,} action runs is above "
                                       f"the bound {bounds.MAX_SIM_RUNS:,}; give fewer --steps")
    results = [(plan, simulate(plan, recipe.profile, steps=steps)) for plan in plans]
    for plan, rep in results:
        if not math.isfinite(rep.makespan_ms) or not all(math.isfinite(d.peak_memory_mb) for d in rep.devices):
            raise SpecError("mpipe.profile", f"the costs are too large: schedule {plan.meta['schedule_name']} "
                                             "predicts a step time or memory that is not a finite number")
    base = results[0][1].makespan_ms
    objs = []
    for plan, rep in results:
        o = {"schedule": plan.meta["schedule_name"], **rep.to_json()}
        o["speedup"] = round(base / rep.makespan_ms, 6) if rep.makespan_ms > 0 else None
        if plan.meta.get("zero"):   # the ZeRO level and the key that gave it (optimizer_shard: true is level 1)
            o["zero"] = dict(plan.meta["zero"])
        if recipe.memory_limit_gb is not None:
            o["memory_limit_exceeded"] = [e.to_json() for e in memory_excess(recipe, plan, rep)]
            warning = memory_warning(recipe, plan, rep)
            if warning:
                print(warning, file=sys.stderr)
        objs.append(o)
    if args.trace or args.png:
        from ..mpipe import draw
        if args.trace:
            draw.write_trace(results, args.trace)
        if args.png:
            draw.write_png(results, args.png)
    for o in objs:
        o["costs"] = recipe.costs   # "mpipe.profile", or how they were estimated
        o["notes"] = list(recipe.notes)   # keys read but without effect on the plan (plan prints them too)
    if args.json:
        print(json.dumps(objs[0] if len(objs) == 1 else objs, indent=1))
        return 0
    P, M = results[0][0].num_devices, results[0][0].num_micro
    print(f"recipe {args.recipe}: P={P} M={M} V={recipe.pp_interleave_num} D={recipe.data_parallel}")
    if results[0][0].meta.get("zero"):
        print(results[0][0].meta["zero"]["line"])
    if recipe.estimated:
        print(f"note: {recipe.costs}")
    for line in recipe.notes:
        print(line)
    rows = []
    for o in objs:
        rows.append([o["schedule"], f"{o['makespan_ms']:.2f}", f"{o['bubble_ratio']:.3f}",
                     f"{max(d['peak_memory_mb'] for d in o['devices']):.1f}", f"{o['speedup']:.2f}x"])
    print(text_table(["schedule", "step_ms", "bubble", "peak_mem_mb", "speedup"], rows))
    return 0
