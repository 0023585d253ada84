"""``hyperparallel train``: validate recipe and plan, then run the job with msrun.

Nothing here imports MindSpore at module import time: the launcher validates
the recipe, derives and checks the plan, writes a job file and starts msrun
(:mod:`hyperparallel.launch`). ``--reference`` trains the same model, data and
seed in this process without a pipeline (MindSpore imported only then).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

from .mpipe.errors import PlanError, SpecError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train the recipe's model with MindSpore (msrun, P x D ranks)")
    p.add_argument("recipe", help="recipe YAML with model:, data:, train: and mpipe: sections")
    p.add_argument("--schedule", default=None, metavar="S", help="override the recipe's mpipe.schedule")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: train.steps)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. mpipe.profile.regions.0.trainable=false")
    p.add_argument("--reference", action="store_true", help="single process, no pipeline (same model/data/seed)")
    p.add_argument("--run-dir", default=None, help="metrics.jsonl and logs go here (default runs/<recipe>)")
    p.add_argument("--save-dir", default=None, help="save every rank's parameters and optimizer state here")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (default train.save_every)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --save-dir")
    p.add_argument("--timeout", type=float, default=3600, help="stop the job after this many seconds")
    p.set_defaults(func=run)


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _prepare(args):
    """Everything checked before launch: recipe, run config, plan, flags. Raises SpecError/PlanError."""
    from .mindspore.config import run_config_of
    from .mpipe.check import assert_valid
    from .mpipe.derive import derive_recipe
    from .mpipe.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    rc = run_config_of(recipe)
    plan = assert_valid(derive_recipe(recipe, args.schedule))
    if args.steps is not None and args.steps < 1:
        raise SpecError("--steps", f"must be >= 1, got {args.steps}")
    if args.save_every is not None and args.save_every < 0:
        raise SpecError("--save-every", f"must be >= 0, got {args.save_every}")
    from .launch import msrun_overrides
    msrun_overrides(plan.num_devices * plan.data_parallel)  # HP_MSRUN_ARGS, checked before launch
    if args.resume:
        if not args.save_dir:
            raise SpecError("--resume", "needs --save-dir (where the checkpoint is)")
        if not os.path.exists(os.path.join(args.save_dir, "rank_0.npz")):
            raise SpecError("--resume", f"no checkpoint in {args.save_dir}")
    return recipe, rc, plan


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def run(args) -> int:
    try:
        recipe, rc, plan = _prepare(args)
    except (SpecError, PlanError) as e:
        return _error(str(e).splitlines()[0])
    steps = args.steps or rc.train.steps
    sched_name = str(plan.meta.get("schedule_name", args.schedule or recipe.schedule))
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = args.run_dir or os.path.join("runs", _slug(f"{stem}_{'reference' if args.reference else sched_name}"))
    os.makedirs(run_dir, exist_ok=True)
    if args.reference:
        return _run_reference(recipe, rc, steps, run_dir)

    world = plan.num_devices * plan.data_parallel
    case = dict(name=sched_name, raw=recipe.raw, plan=plan.to_json(), steps=steps, schedule=sched_name,
                run_dir=os.path.abspath(run_dir),
                save_dir=os.path.abspath(args.save_dir) if args.save_dir else None,
                save_every=args.save_every, resume=bool(args.resume))
    print(f"train {stem}: schedule {sched_name}, P={plan.num_devices} D={plan.data_parallel} "
          f"M={plan.num_micro} on {world} {rc.device} ranks, {steps} steps; run dir {run_dir}", flush=True)
    from .launch import launch
    res = launch({"device": rc.device, "cases": [case]}, world, os.path.join(run_dir, "logs"),
                 timeout_s=args.timeout)
    if res.returncode != 0:
        print(f"error: job failed (exit {res.returncode}): {res.message}", file=sys.stderr)
        return res.returncode
    print(f"done in {res.wall_s:.1f} s; metrics in {os.path.join(run_dir, 'metrics.jsonl')}", flush=True)
    return 0


def _run_reference(recipe, rc, steps: int, run_dir: str) -> int:
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.join(os.path.abspath(run_dir), "mindformers"))
    from .mindspore import compat
    from .mindspore.reference import Reference
    compat.setup_device(rc.device)
    ref = Reference(rc, recipe.micro_batch_num * recipe.data_parallel,
                    {r.name: r.trainable for r in recipe.profile.regions})
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for step in range(steps):
            t0 = time.perf_counter()
            loss, _ = ref.step(step)
            dt = time.perf_counter() - t0
            print(f"[reference] step {step + 1}/{steps} loss {loss:.6f} step_time {dt:.3f}s", flush=True)
            f.write(json.dumps({"step": step, "loss": loss, "step_time_s": dt, "schedule": "reference"}) + "\n")
    return 0
