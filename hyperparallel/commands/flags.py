"""Every flag is honoured on the path it is given on, or refused there (one line naming the flag and
the path), before anything runs: ``train --reference --save-dir D`` saves nothing, so it is refused.

A flag counts as given when it is on the command line (:func:`given_flags`: a second parse with every
default suppressed), whatever its value, so ``tune --steps 8`` without ``--verify`` is refused too.
``tests/unit/test_cli_flags.py`` walks every flag of ``train``, ``bench``, ``profile`` and ``tune`` over
their paths against :data:`NOT_HONOURED`.
"""
from __future__ import annotations

import argparse
from typing import Callable, FrozenSet, List, Optional, Sequence, Tuple

from ..errors import SpecError


def _reference(a) -> bool:
    return bool(getattr(a, "reference", False))


def _no_save_dir(a) -> bool:
    return not _reference(a) and not getattr(a, "save_dir", None)


def _no_checkpoint(a) -> bool:
    return not (getattr(a, "save_dir", None) or getattr(a, "resume", False) or getattr(a, "resume_from", None))


def _profile_not_measured(a) -> bool:
    from ..bench.bench import measures_profile
    return not measures_profile(a)


def _compile_modes(a) -> bool:
    return len(getattr(a, "compile", None) or []) > 1


def _no_verify(a) -> bool:
    return not getattr(a, "verify", 0)


_REF_CKPT = "the reference saves no checkpoint: save with the pipeline run"
_REF_RESUME = ("the reference reads no save dir; start it from a step with --resume-from STEP_DIR (as the pipeline "
               "run's --resume would pick it)")
#: (command, flag dest, on this path it is not honoured, the path, why): the first that applies is refused
NOT_HONOURED: Tuple[Tuple[str, str, Callable, str, str], ...] = (
    ("train", "schedule", _reference, "with --reference", "the reference runs no pipeline (one process, the same "
                                                     "losses for every schedule); leave it out"),
    ("train", "compile", _reference, "with --reference", "the reference runs its model op by op; mpipe.compile is the "
                                                    "pipeline ranks' setting"),
    ("train", "save_dir", _reference, "with --reference", _REF_CKPT),
    ("train", "save_every", _reference, "with --reference", _REF_CKPT),
    ("train", "save_format", _reference, "with --reference", _REF_CKPT),
    ("train", "resume", _reference, "with --reference", _REF_RESUME),
    ("train", "timeout", _reference, "with --reference", "the reference runs in this process, without the launcher "
                                                    "that enforces the timeout"),
    ("train", "save_every", _no_save_dir, "without --save-dir", "nothing is saved; give --save-dir"),
    ("train", "save_format", _no_save_dir, "without --save-dir", "nothing is saved; give --save-dir"),
    ("train", "overwrite_save_dir", _reference, "with --reference", _REF_CKPT),
    ("train", "overwrite_save_dir", _no_save_dir, "without --save-dir", "there is no save dir to overwrite"),
    ("train", "no_digest", _no_checkpoint, "without --save-dir, --resume or --resume-from",
     "no checkpoint is written or read"),
    ("bench", "profile_samples", _profile_not_measured, "with --profile or --recipe-profile",
     "the profile is not measured in this run"),
    ("bench", "png", _compile_modes, "with --compile given twice", "comparing compile modes draws no chart; use --out"),
    ("tune", "steps", _no_verify, "without --verify", "only --verify runs steps"),
    ("tune", "warmup", _no_verify, "without --verify", "only --verify runs steps"),
    ("tune", "run_dir", _no_verify, "without --verify", "only --verify launches (and writes a run directory)"),
    ("tune", "timeout", _no_verify, "without --verify", "only --verify launches"),
)


def flag_name(parser: argparse.ArgumentParser, command: str, dest: str) -> str:
    """``--save-dir`` for ``save_dir`` (the option string the parser of ``command`` gives that dest)."""
    for a in _subparser(parser, command)._actions:
        if a.dest == dest and a.option_strings:
            return max(a.option_strings, key=len)
    return "--" + dest.replace("_", "-")


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) and command in a.choices:
            return a.choices[command]
    raise KeyError(command)


def _suppress_defaults(parser: argparse.ArgumentParser) -> None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                _suppress_defaults(sub)
        elif a.dest != "help":
            a.default = argparse.SUPPRESS


def given_flags(build: Callable[[], argparse.ArgumentParser], argv: Optional[Sequence[str]]) -> FrozenSet[str]:
    """The dests of the options on the command line (not filled by their defaults)."""
    parser = build()
    _suppress_defaults(parser)
    return frozenset(vars(parser.parse_args(argv)))


def refusals(command: str, args, given: FrozenSet[str]) -> List[Tuple[str, str, str]]:
    """(flag dest, path, why) of every given flag this path does not honour, in :data:`NOT_HONOURED` order."""
    out, seen = [], set()
    for cmd, dest, applies, path, why in NOT_HONOURED:
        if cmd == command and dest in given and dest not in seen and applies(args):
            out.append((dest, path, why))
            seen.add(dest)
    return out


def refuse_unhonoured(parser: argparse.ArgumentParser, args, given: FrozenSet[str]) -> None:
    """SpecError naming the first given flag that the command's path would not honour."""
    found = refusals(getattr(args, "command", ""), args, given)
    if found:
        dest, path, why = found[0]
        more = f" ({len(found) - 1} more: {', '.join(flag_name(parser, args.command, d) for d, _, _ in found[1:])})" \
            if len(found) > 1 else ""
        raise SpecError(flag_name(parser, args.command, dest), f"not honoured {path}: {why}{more}")
