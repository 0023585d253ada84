"""``hyperparallel plan`` and ``hyperparallel check`` (pure Python)."""
from __future__ import annotations

import json
import os
import sys

from ..mpipe import bounds
from ..mpipe.check import check
from ..errors import SpecError
from ..mpipe.ir import Plan
from ..mpipe.table import program_table
from ..recipe import checked_plan, derive_recipe, memory_warning
from ..recipe.memory import memory_line
from ..runconfig import load_parsed
from ..util import output_file, write_text


def check_generated_data(recipe) -> None:
    """The generated data's ``data:`` keys checked by the commands that plan too (they never build the data;
    a conversations section names files, checked by ``data check`` and ``train``)."""
    sec = recipe.raw.get("data")
    if sec is None or (isinstance(sec, dict) and sec.get("type", "synthetic") == "synthetic"):
        from ..data import data_config
        data_config(recipe.raw)


def check_tensor_parallel(recipe) -> None:
    """T (``parallel_config.model_parallel``) checked against the model as ``train`` checks it (the adapter's
    ``check_tensor_parallel``: heads, MLP channels, vocabulary), so a plan never predicts a split the runtime
    refuses. A model whose adapter does not split layers (the base rule refuses any T > 1), or that has no
    adapter that can be built from its section alone, is planned as given (plan reads a MindFormers config
    as given; ``train`` names what it cannot run)."""
    if recipe.tensor_parallel <= 1:
        return
    from ..models import ModelAdapter, adapter_for
    try:
        model = adapter_for(recipe.raw.get("model"), {}, 0)
    except Exception:   # noqa: BLE001 - no adapter built here: train names why
        return
    if type(model).check_tensor_parallel is not ModelAdapter.check_tensor_parallel:
        model.check_tensor_parallel(recipe.tensor_parallel)


def cmd_plan(args) -> int:
    if args.export:
        output_file("--export", args.export, inputs=(args.recipe,))
    recipe = load_parsed(args.recipe, args.overrides)
    plan = checked_plan(recipe, args.schedule)
    check_generated_data(recipe)
    check_tensor_parallel(recipe)
    print(f"schedule {plan.meta['schedule_name']}: P={plan.num_devices} M={plan.num_micro} "
          f"V={plan.meta['pp_interleave_num']} D={plan.data_parallel}")
    if plan.meta.get("zero"):
        print(plan.meta["zero"]["line"])
    print(cut_lines(plan))
    if recipe.estimated:
        print(f"note: {recipe.costs}")
    for line in recipe.notes:
        print(line)
    print(program_table(plan))
    if args.export:
        write_text(args.export, plan.dumps())
        print(f"wrote {args.export}")
    report = None
    if recipe.memory_limit_gb is not None:   # one cost-model run for the line and the warning
        from ..mpipe.cost import simulate
        from ..recipe import steady_steps
        report = simulate(plan, recipe.profile, steps=steady_steps([plan]))
    line = memory_line(recipe, plan, report)
    if line:
        print(line)
    warning = memory_warning(recipe, plan, report)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def cut_lines(plan) -> str:
    """Layers of every chunk, per region: ``layers llm: 9@0 10@1 12@2 9@3``, one line a region; a recomputed
    chunk ends in ``R`` (``1@0R``: its forward keeps only its input and runs again before its backward)."""
    out = []
    for region in dict.fromkeys(c.region for c in plan.chunks):
        cs = [c for c in plan.chunks if c.region == region]
        devs = lambda c: ",".join(str(d) for d in c.devices)  # noqa: E731
        note = "; R: recomputed" if any(c.recompute for c in cs) else ""
        out.append(f"layers {region}: " + " ".join(f"{c.layers}@{devs(c)}{'R' if c.recompute else ''}" for c in cs)
                   + f"  ({sum(c.layers for c in cs)} layers; chunk layers@device{note})")
    return "\n".join(out)


def load_plan_file(path: str) -> Plan:
    """An exported plan JSON file, every value checked: refusals name the file and the field."""
    if os.path.isdir(path):
        raise SpecError("plan", f"{path} is a directory, not a plan JSON file")
    if not os.path.isfile(path):
        raise SpecError("plan", f"file not found: {path}")
    if os.path.getsize(path) > bounds.MAX_PLAN_BYTES:
        raise SpecError("plan", f"{path} is {os.path.getsize(path):,} bytes, above the bound {bounds.MAX_PLAN_BYTES:,}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError("plan", f"{path} byte {e.start} (0x{data[e.start]:02x}): not UTF-8") from None
    try:
        return Plan.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError("plan", f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise SpecError("plan", f"{path}: nested too deep to read") from None
    except SpecError as e:
        raise SpecError(f"plan {e.field}" if e.field != "plan" else "plan", f"{path}: {str(e)[len(e.field) + 2:]}") \
            from None


def cmd_check(args) -> int:
    if args.recipe.endswith(".json"):
        plan = load_plan_file(args.recipe)
    else:
        recipe = load_parsed(args.recipe, args.overrides)
        check_generated_data(recipe)
        plan = derive_recipe(recipe, args.schedule)
        for line in recipe.notes:
            print(line)
    errs = check(plan)
    if errs:
        for e in errs[:10]:
            print(f"error: {e}", file=sys.stderr)
        if len(errs) > 10:
            print(f"error: ... and {len(errs) - 10} more", file=sys.stderr)
        return 1
    n = sum(len(p) for p in plan.programs.values())
    print(f"OK: {plan.num_devices} devices, {plan.num_micro} micro-batches, {n} actions; complete, "
          "dependency-ordered, FIFO-paired, collectives aligned, deadlock-free")
    return 0
