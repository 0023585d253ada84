"""The ``hyperparallel`` command: plan, check, simulate (pure Python); train, profile, bench (MindSpore, via msrun); data check.

Bad input exits with status 2 and a one-line ``error: field: message``; no traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from .mpipe.errors import PlanError, SpecError


def _add_recipe_args(p: argparse.ArgumentParser, many_schedules: bool = False) -> None:
    p.add_argument("recipe", help="recipe YAML (MindFormers-style, with an mpipe: section)")
    if many_schedules:
        p.add_argument("--schedule", action="append", default=None, metavar="S",
                       help="schedule short name or list form; repeat to compare (the first is the baseline)")
    else:
        p.add_argument("--schedule", default=None, metavar="S", help="override the recipe's mpipe.schedule")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. parallel_config.pipeline_stage=8")


def cmd_plan(args) -> int:
    from .mpipe.check import assert_valid
    from .mpipe.derive import derive_recipe
    from .mpipe.recipe import load_recipe
    from .mpipe.table import program_table

    recipe = load_recipe(args.recipe, args.overrides)
    plan = assert_valid(derive_recipe(recipe, args.schedule))
    print(f"schedule {plan.meta['schedule_name']}: P={plan.num_devices} M={plan.num_micro} "
          f"V={plan.meta['pp_interleave_num']} D={plan.data_parallel}")
    print(cut_lines(plan))
    print(program_table(plan))
    if args.export:
        with open(args.export, "w") as f:
            f.write(plan.dumps())
        print(f"wrote {args.export}")
    return 0


def cut_lines(plan) -> str:
    """Layers of every chunk, per region: ``llm: chunk 0 layers 0-8 (9) on device 0``, one line a region."""
    out = []
    for region in dict.fromkeys(c.region for c in plan.chunks):
        cs = [c for c in plan.chunks if c.region == region]
        devs = lambda c: ",".join(str(d) for d in c.devices)  # noqa: E731
        out.append(f"layers {region}: " + " ".join(f"{c.layers}@{devs(c)}" for c in cs)
                   + f"  ({sum(c.layers for c in cs)} layers; chunk layers@device)")
    return "\n".join(out)


def cmd_check(args) -> int:
    from .mpipe.check import check
    from .mpipe.derive import derive_recipe
    from .mpipe.ir import Plan
    from .mpipe.recipe import load_recipe

    if args.recipe.endswith(".json"):
        try:
            with open(args.recipe) as f:
                plan = Plan.loads(f.read())
        except FileNotFoundError:
            raise SpecError("plan", f"file not found: {args.recipe}") from None
        except json.JSONDecodeError as e:
            raise SpecError("plan", f"{args.recipe} is not valid JSON: {e}") from None
        except (ValueError, TypeError, KeyError) as e:
            raise SpecError("plan", f"{args.recipe}: {e}") from None
    else:
        plan = derive_recipe(load_recipe(args.recipe, args.overrides), args.schedule)
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


def cmd_simulate(args) -> int:
    from .mpipe.simulate_cli import run_simulate
    return run_simulate(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hyperparallel", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="derive and print each device's program")
    _add_recipe_args(p)
    p.add_argument("--export", metavar="FILE.json", help="write the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("check", help="validate a plan JSON file or a recipe's derived plan")
    p.add_argument("recipe", metavar="FILE.json|RECIPE", help="exported plan JSON, or a recipe YAML")
    p.add_argument("--schedule", default=None, metavar="S")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("simulate", help="predict step time, bubbles and memory with the cost model")
    _add_recipe_args(p, many_schedules=True)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--png", metavar="FILE.png", help="draw a Gantt timeline (matplotlib)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to execute (steady state)")
    p.set_defaults(func=cmd_simulate)

    from . import train_cli
    from .bench import bench as bench_cmd, profile as profile_cmd
    from .data import check as data_check
    train_cli.add_parser(sub)
    data_check.add_parser(sub)
    profile_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
