"""``hyperparallel data check RECIPE``: scan a recipe's whole data set and report every problem.

The scan is the run-time index check (JSON, records, placeholders, tokenized length,
image files and headers) plus a full decode of every image with the training ops
(``mindspore.dataset.vision``). Exit status: 0 clean, 1 problems found, 2 bad
arguments (recipe or ``data:`` section). ``hyperparallel train`` runs the same scan
before launch (:func:`precheck`).
"""
from __future__ import annotations

import sys
from typing import List, Tuple

from hyperparallel.mpipe.errors import SpecError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("data", help="data set tools: check (scan a recipe's data for bad samples)")
    sub = p.add_subparsers(dest="data_command", required=True)
    c = sub.add_parser("check", help="scan the recipe's whole data set; report every problem with counts")
    c.add_argument("recipe", help="recipe YAML with a data: section")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a recipe value, e.g. data.path=my.jsonl")
    c.set_defaults(func=run)


def scan(rc) -> Tuple[int, list, list]:
    """(records read, usable samples, problems) of a conversations run config, decoding every image."""
    from .conversations import Problem, build_index, check_image
    from .pixels import decode_eager, transforms
    from .text import SampleProblem
    cfg = rc.data
    ops = transforms(cfg.image_size, cfg.mean, cfg.std)
    decoded = {}

    def check_and_decode(path: str) -> None:
        check_image(path)
        if path not in decoded:
            try:
                decode_eager(path, ops)
                decoded[path] = None
            except RuntimeError as e:
                decoded[path] = str(e)
        if decoded[path]:
            raise SampleProblem("undecodable_image", decoded[path].replace("data: ", "", 1))

    samples, problems = build_index(cfg, rc.model.image_tokens(), check_and_decode)
    problems: List[Problem]
    return len(samples) + len(problems), samples, problems


def _config(recipe_path: str, overrides):
    from hyperparallel.mindspore.config import run_config_of
    from hyperparallel.mpipe.recipe import load_recipe
    return run_config_of(load_recipe(recipe_path, overrides))


def _tokens_per_image(rc) -> None:
    try:
        rc.model.image_tokens()
    except NotImplementedError as e:
        raise SpecError("model", str(e)) from None


def precheck(rc, recipe_path: str) -> str:
    """Before launch: SpecError if the data has problems the run would stop on; else a summary line
    ('' for generated data)."""
    from .conversations import ConversationsConfig, summary
    if not isinstance(rc.data, ConversationsConfig):
        return ""
    _tokens_per_image(rc)
    try:
        n, samples, problems = scan(rc)
    except ValueError as e:
        raise SpecError(*_split(str(e))) from None
    hint = f"list all: hyperparallel data check {recipe_path}"
    if problems and rc.data.on_bad_sample == "error":
        raise SpecError("data", f"{len(problems)} bad sample(s) in {rc.data.path} ({summary(problems)}); "
                                f"first: {problems[0]} ({hint}; or set data.on_bad_sample=skip)")
    late = [p for p in problems if p.kind == "undecodable_image"]
    if late:
        raise SpecError("data", f"{len(late)} image(s) pass the header check but fail to decode, so the run "
                                f"cannot skip their samples; first: {late[0]} ({hint}); fix or remove them")
    line = f"data: {rc.data.path}: {len(samples)} usable samples"
    if problems:
        line += f", skipping {len(problems)} bad sample(s) ({summary(problems)}; {hint})"
    return line


def _split(msg: str):
    field, _, rest = msg.splitlines()[0].partition(": ")
    return field, rest or msg


def run(args) -> int:
    from .conversations import ConversationsConfig, summary
    rc = _config(args.recipe, args.overrides)   # SpecError -> exit 2 (cli.main)
    if not isinstance(rc.data, ConversationsConfig):
        print(f"data check {args.recipe}: data.type synthetic is generated; nothing to check")
        return 0
    _tokens_per_image(rc)
    try:
        n, samples, problems = scan(rc)
    except ValueError as e:   # the file as a whole is unusable (a malformed .json list)
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"data check {args.recipe}: {rc.data.path}: {n} samples, {len(samples)} usable, "
          f"{len(problems)} with problems")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        print(f"problems by kind: {summary(problems)} (data.on_bad_sample: skip leaves these "
              f"{len(problems)} out; error stops)", file=sys.stderr)
        return 1
    return 0
