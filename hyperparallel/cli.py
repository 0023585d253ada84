"""The ``hyperparallel`` command: every sub-command's parser, in one place.

plan, check, simulate (pure Python); train, profile, bench (MindSpore, via msrun); data check; ckpt.
The commands themselves live in :mod:`hyperparallel.commands` and :mod:`hyperparallel.bench` (none
imports MindSpore before it runs).
Bad input exits with status 2 and a one-line ``error: field: message``; no traceback.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import List, Optional

from .bench import bench, profile
from .commands import data, flags, plan, simulate, train, tune
from .errors import PlanError, SpecError
from .util import error, writable_dir


# -- flags shared by several commands ---------------------------------------------------------

def _recipe(p, help_text="recipe YAML (MindFormers-style, with an mpipe: section)") -> None:
    p.add_argument("recipe", help=help_text)


def _schedule(p, many: bool = False, help_text: str = "override the recipe's mpipe.schedule") -> None:
    if many:
        p.add_argument("--schedule", action="append", default=None, metavar="S", help=help_text)
    else:
        p.add_argument("--schedule", default=None, metavar="S", help=help_text)


def _overrides(p) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. parallel_config.pipeline_stage=8")


def _compile(p, many: bool = False) -> None:
    if many:
        p.add_argument("--compile", action="append", default=None, metavar="jit|eager",
                       help="chunk bodies compiled (jit) or op by op (eager); repeat to compare both, every "
                            "schedule under each (default: the recipe's mpipe.compile, jit)")
    else:
        p.add_argument("--compile", default=None, metavar="jit|eager",
                       help="chunk bodies compiled (jit) or op by op (eager): sets mpipe.compile (default jit)")


def compile_flag(args) -> None:
    """``--compile`` checked (SpecError naming the flag and the allowed values); a single value becomes the
    override ``mpipe.compile=VALUE`` (after the ``--set`` ones: the flag wins)."""
    from .recipe.recipe import COMPILE_MODES
    vals = getattr(args, "compile", None)
    if vals is None:
        return
    for v in (vals if isinstance(vals, list) else [vals]):
        if v not in COMPILE_MODES:
            raise SpecError("--compile", f"{v!r} unknown; allowed: {', '.join(COMPILE_MODES)}")
    if isinstance(vals, list):
        if len(set(vals)) != len(vals):
            raise SpecError("--compile", "each mode once")
        return
    args.overrides = list(args.overrides) + [f"mpipe.compile={vals}"]


def _run_dir(p, default: str) -> None:
    p.add_argument("--run-dir", default=None, help=f"logs and results go here (default {default})")


def _timeout(p, default: float, what: str = "the job") -> None:
    p.add_argument("--timeout", type=float, default=default, help=f"stop {what} after this many seconds")


# -- the parsers --------------------------------------------------------------------------------

def _plan_parsers(sub) -> None:
    p = sub.add_parser("plan", help="derive and print each device's program")
    _recipe(p)
    _schedule(p)
    _overrides(p)
    p.add_argument("--export", metavar="FILE.json", help="write the plan as JSON")
    p.set_defaults(func=plan.cmd_plan)

    p = sub.add_parser("check", help="validate a plan JSON file or a recipe's derived plan")
    p.add_argument("recipe", metavar="FILE.json|RECIPE", help="exported plan JSON, or a recipe YAML")
    _schedule(p)
    _overrides(p)
    p.set_defaults(func=plan.cmd_check)

    p = sub.add_parser("simulate", help="predict step time, bubbles and memory with the cost model")
    _recipe(p)
    _schedule(p, many=True, help_text="schedule short name or list form; repeat to compare (the first is the "
                                      "baseline)")
    _overrides(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--png", metavar="FILE.png", help="draw a Gantt timeline (matplotlib)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to execute (steady state)")
    p.add_argument("--data-steps", type=int, default=None, metavar="N",
                   help="replay the encoder work of the first N steps of the recipe's data (conversations); "
                        "a schedule may carry its own settings: 'transpose|data.balance=encoder'")
    p.set_defaults(func=simulate.run_simulate)


def _train_parsers(sub) -> None:
    p = sub.add_parser("train", help="train the recipe's model with MindSpore (msrun, P x D ranks)")
    _recipe(p, "recipe YAML with model:, data:, train: and mpipe: sections")
    _schedule(p)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: train.steps)")
    _overrides(p)
    p.add_argument("--reference", action="store_true", help="single process, no pipeline (same model/data/seed)")
    _compile(p)
    _run_dir(p, "runs/<recipe>_<schedule>: metrics.jsonl and logs/")
    p.add_argument("--save-dir", default=None, help="save every rank's parameters and optimizer state here")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (default train.save_every)")
    p.add_argument("--save-format", choices=("safetensors", "ckpt"), default="safetensors",
                   help="MindSpore checkpoint file format (default safetensors)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in --save-dir")
    p.add_argument("--resume-from", default=None, metavar="PATH",
                   help="start from a checkpoint: a step directory, a save directory (its newest complete "
                        "step) or a single-process MindSpore .safetensors/.ckpt file (step 0)")
    p.add_argument("--overwrite-save-dir", action="store_true",
                   help="remove the step directories an earlier run left in --save-dir before this run starts "
                        "(without it, a save dir holding complete checkpoints is refused unless --resume or "
                        "--resume-from continues them)")
    p.add_argument("--no-digest", action="store_true",
                   help="skip the SHA-256 of checkpoint files when saving and resuming (huge files; sizes and "
                        "headers are still checked; the log says so)")
    _timeout(p, 3600)
    p.set_defaults(func=train.run)

    p = sub.add_parser("ckpt", help="list the checkpoints of a save directory; merge a step into one file")
    p.add_argument("path", help="a save directory (--save-dir), a step directory or a checkpoint file")
    p.add_argument("--merge", default=None, metavar="OUT",
                   help="write the step (newest complete of a save directory) as one .safetensors/.ckpt file")
    p.add_argument("--with-optimizer", action="store_true", help="--merge also writes the optimizer state")
    p.add_argument("--no-digest", action="store_true",
                   help="do not check the files' SHA-256 (sizes and headers only; the output says so)")
    p.add_argument("--export-hf", default=None, metavar="OUT_DIR",
                   help="write the step (newest complete of a save directory) as a Hugging Face model directory "
                        "(config.json + model.safetensors) that from_pretrained loads; a run with model.lora "
                        "writes PEFT's adapter_model.safetensors + adapter_config.json (PeftModel.from_pretrained)")
    p.add_argument("--merge-lora", action="store_true",
                   help="--export-hf of a model.lora run: the adapters merged into the base (PEFT's "
                        "merge_and_unload), a whole Hugging Face model directory")
    p.add_argument("--force", action="store_true",
                   help="--merge may replace an existing file, --export-hf write into a non-empty folder (its "
                        "previous weights are replaced, other files kept), either write inside a save directory "
                        "(never inside a step directory)")
    p.set_defaults(func=train.run_ckpt)

    p = sub.add_parser("data", help="data set tools: check (scan a recipe's data for bad samples)")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("check", help="scan the recipe's whole data set; report every problem with counts")
    _recipe(c, "recipe YAML with a data: section")
    _overrides(c)
    c.set_defaults(func=data.run)


def _measure_parsers(sub) -> None:
    p = sub.add_parser("profile", help="measure per-layer F/B/W costs and the link with MindSpore (msrun)")
    _recipe(p, "recipe YAML with model:, data:, train: and mpipe: sections")
    _schedule(p, help_text="schedule whose cut is measured (default: the recipe's); with --in-pipeline the "
                           "reference schedule run on real ranks (default gpipe)")
    p.add_argument("--in-pipeline", action="store_true",
                   help="take the F/B/W costs from a real run of the reference schedule (--schedule, default gpipe), "
                        "every action timed, instead of from the tight loop")
    _overrides(p)
    p.add_argument("--out", default=None, metavar="FILE.yaml",
                   help="write the measured profile here (default: RECIPE_STEM.profile.yaml next to the recipe)")
    p.add_argument("--samples", type=int, default=8, help="steps of micro-batches timed per rank (default 8)")
    p.add_argument("--repeats", type=int, default=3,
                   help="passes over the sampled micro-batches; the median per action is kept (default 3)")
    _compile(p)
    _run_dir(p, "runs/profile_<recipe>")
    _timeout(p, 900)
    p.set_defaults(func=profile.run)

    p = sub.add_parser("bench", help="run schedules side by side on real ranks (msrun) against the cost model")
    _recipe(p, "recipe YAML with model:, data:, train: and mpipe: sections")
    _schedule(p, many=True, help_text="schedule to run; repeat to compare (the first is the baseline of the ratio)")
    p.add_argument("--steps", type=int, default=6, help="measured steps per launch (default 6)")
    p.add_argument("--warmup", type=int, default=2, help="steps discarded at the start of every launch (default 2)")
    p.add_argument("--repeats", type=int, default=3,
                   help="repeats (default 3): one launch each running every schedule in rotation (--rotate steps), "
                        "or one launch per schedule (--rotate launches)")
    p.add_argument("--max-contention", type=float, default=0.1, metavar="FRAC",
                   help="drop kept steps during which other processes used a rank's core for more than FRAC "
                        "of the step (default 0.1; 1 keeps every step)")
    _overrides(p)
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
    _compile(p, many=True)
    _run_dir(p, "runs/bench_<recipe>")
    _timeout(p, 900, "one launch")
    p.set_defaults(func=bench.run)


def _tune_parser(sub) -> None:
    p = sub.add_parser("tune", help="search the schedule algebra for the recipe's best plan under a memory limit")
    _recipe(p)
    p.add_argument("--memory-limit", type=float, default=None, metavar="GB",
                   help="drop candidates whose predicted peak memory on some device exceeds this (GB = 1000 MB)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="candidates in the table (default 5)")
    p.add_argument("--out", default=None, metavar="FILE.yaml",
                   help="write the first candidate as a recipe overlay (base_config + the chosen keys)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _overrides(p)
    p.add_argument("--profile", action="append", default=[], metavar="FILE.yaml",
                   help="a profile measured at another micro-batch size (mpipe.profile.micro_batch_size, as "
                        "hyperparallel profile/bench write it); repeat for several sizes")
    p.add_argument("--verify", type=int, default=0, metavar="N",
                   help="run the top N, the recipe's own schedule and 1f1b in one bench launch on the recipe's ranks "
                        "(msrun), in rotation, and report measured against predicted order")
    p.add_argument("--steps", type=int, default=8, help="--verify: measured steps per case (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="--verify: steps discarded per case (default 2)")
    _run_dir(p, "runs/tune_<recipe>")
    _timeout(p, 900, "one verify launch")
    p.set_defaults(func=tune.run)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hyperparallel", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    _plan_parsers(sub)
    _train_parsers(sub)
    _measure_parsers(sub)
    _tune_parser(sub)
    return ap


def _check_dirs(args) -> None:
    """The output directories a command will write, refused before any work when they cannot be."""
    for flag in ("run_dir", "save_dir"):
        path = getattr(args, flag, None)
        if path is not None:
            writable_dir("--" + flag.replace("_", "-"), path)
    for flag in ("timeout",):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise SpecError(f"--{flag}", f"must be a number of seconds > 0, got {v}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # a flag the command's path would not honour (train --reference --save-dir): refused, named
        flags.refuse_unhonoured(parser, args, flags.given_flags(build_parser, argv))
        _check_dirs(args)
        compile_flag(args)
        return args.func(args)
    except (SpecError, PlanError) as e:
        return error(str(e).splitlines()[0])
    except OSError as e:   # the last guard: a file the checks above did not foresee, named, no traceback
        return error(f"{e.filename or 'file'}: {e.strerror or e}")
    except KeyboardInterrupt:   # Ctrl-C before a launch (during one, the launcher handles it): no traceback
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
