"""``hyperparallel data check RECIPE``: scan a recipe's whole data set and report every problem.

Exit status: 0 clean, 1 problems found, 2 bad arguments (recipe or ``data:`` section).
``hyperparallel train`` runs the same scan before launch (:func:`precheck`).
"""
from __future__ import annotations

import shlex
import sys

from ..data.conversations import LATE_KINDS, layout_for, scan, summary
from ..errors import SpecError
from ..runconfig import load_parsed


def _data_format(rc) -> dict:
    """The model adapter's micro-batch layout (``data_format()``)."""
    try:
        return rc.model.data_format()
    except NotImplementedError as e:
        raise SpecError("model", str(e)) from None


def precheck(rc, recipe_path: str, overrides=()):
    """Before launch: SpecError if the data has problems the run would stop on; else (a summary line, the
    usable samples) (``('', None)`` for generated data)."""
    if not rc.data.checks_files:
        return "", None
    n, samples, problems = scan(rc.data, _data_format(rc))
    sets = "".join(f" --set {shlex.quote(o)}" for o in overrides)   # the hint repeats the user's --set flags
    hint = f"list all: hyperparallel data check {recipe_path}{sets}"
    if n == 0:
        raise SpecError("data.path", f"{rc.data.path} has no samples")
    if not samples:   # skip would leave nothing to train on: never suggest it
        raise SpecError("data.path", f"no usable sample in {rc.data.path}: all {n} have problems "
                                     f"({summary(problems)}); first: {problems[0]} ({hint})")
    late = [p for p in problems if p.kind in LATE_KINDS]
    if problems and rc.data.on_bad_sample == "error":
        skip = "" if late else "; or set data.on_bad_sample=skip"   # skip cannot leave out late problems
        raise SpecError("data", f"{len(problems)} bad sample(s) in {rc.data.path} ({summary(problems)}); "
                                f"first: {problems[0]} ({hint}{skip})")
    if late:
        raise SpecError("data", f"{len(late)} image(s) pass the header check but fail to decode or decode to "
                                f"another size, so the run cannot skip their samples; first: {late[0]} ({hint}); "
                                f"fix or remove them")
    line = f"data: {rc.data.path}: {len(samples)} usable samples"
    if problems:
        line += f", skipping {len(problems)} bad sample(s) ({summary(problems)}; {hint})"
    return line, len(samples)


def run(args) -> int:
    rc = load_parsed(args.recipe, args.overrides).run   # SpecError -> exit 2 (cli.main)
    if not rc.data.checks_files:
        print(f"data check {args.recipe}: data.type {rc.data.type} is generated; nothing to check")
        return 0
    layout = layout_for(rc.data, _data_format(rc))   # a key or tokenizer the model's layout refuses: exit 2
    try:
        n, samples, problems = scan(rc.data, layout)
    except SpecError as e:   # the file as a whole is unusable (a malformed .json list)
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"data check {args.recipe}: {rc.data.path}: {n} samples, {len(samples)} usable, "
          f"{len(problems)} with problems")
    if n == 0:
        print(f"error: data.path: {rc.data.path} has no samples", file=sys.stderr)
        return 1
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems and not samples:
        print(f"problems by kind: {summary(problems)} (no usable sample: data.on_bad_sample: skip would leave "
              "nothing to train on)", file=sys.stderr)
        return 1
    late = [p for p in problems if p.kind in LATE_KINDS]
    if late:
        print(f"problems by kind: {summary(problems)} ({len(late)} image(s) fail only when decoded: "
              "data.on_bad_sample: skip cannot leave their samples out; fix or remove them)", file=sys.stderr)
        return 1
    if problems:
        print(f"problems by kind: {summary(problems)} (data.on_bad_sample: skip leaves these "
              f"{len(problems)} out; error stops)", file=sys.stderr)
        return 1
    return 0
