"""A step whose loss or global gradient norm is NaN or infinite (``train.nonfinite``), decided before its update.

The step loss and the square of the global gradient norm are sums over every rank in the step's one
all-reduce (:meth:`~.rank.RankRuntime.step`): a NaN or infinity on any rank (in a pipeline only the last
stage has the loss) makes the reduced values non-finite on every rank, so every rank reaches the same
verdict from the same numbers, before any rank applies the update. With ``train.nonfinite: stop`` (the
default) every rank raises :class:`NonFiniteStep`; the worker prints a :data:`NONFINITE` line and exits with
:data:`NONFINITE_EXIT`, which the launcher reports naming the step: nothing of that step is saved, the last
checkpoint is the one before it. With ``skip`` no rank updates in that step (as MindSpore's loss-scale
overflow check skips the optimizer: its ``global_step`` stays, so a schedule is not advanced either); the
metrics line says ``skipped`` and the skipped steps are counted. With a loss scale
(``runner_wrapper.scale_sense``) a finite loss with a non-finite gradient norm is an overflow, not this: the
step is skipped whatever ``train.nonfinite`` says and a dynamic scale goes down (:mod:`.loss_scale`).

Pure Python: the launcher reads the line prefix and exit status without MindSpore.
"""
from __future__ import annotations

import json
import math
from typing import Optional, Sequence

NONFINITE = "non-finite step: "   # the ranks' line; the launcher maps it to NONFINITE_EXIT
NONFINITE_EXIT = 65               # EX_DATAERR: the run's numbers went bad (not a crash, not a save failure)


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def verdict(loss: float, grad_norm: float) -> str:
    """What of a step is not finite (``loss nan``, ``grad norm inf``, ``loss nan and grad norm nan``), '' if
    both are finite."""
    bad = [f"{name} {value}" for name, value in (("loss", loss), ("grad norm", grad_norm)) if not finite(value)]
    return " and ".join(bad)


class NonFiniteStep(RuntimeError):
    """A step stopped before its update (``train.nonfinite: stop``): ``step`` 0-based, ``what`` the verdict,
    ``ranks`` those whose own part (loss share, counted gradients) was not finite (None: not known)."""

    def __init__(self, step: int, what: str, ranks: Optional[Sequence[int]] = None):
        self.step, self.what, self.ranks = int(step), what, None if ranks is None else list(ranks)
        super().__init__(self.describe())

    def describe(self, steps: int = 0, saved: str = "") -> str:
        """One line: the step (1-based, as the console counts), what was not finite, where, what was kept."""
        of = f"/{steps}" if steps else ""
        where = ""
        if self.ranks:
            where = f" (non-finite on rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))})"
        kept = f"; {saved}" if saved else ""
        return (f"step {self.step + 1}{of}: {self.what}{where}; stopped before its update (train.nonfinite: stop; "
                f"skip skips such steps){kept}")


def nulled(obj):
    """``obj`` with every NaN or infinite float replaced by None (JSON ``null``), through dicts, lists, tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nulled(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nulled(v) for v in obj]
    return obj


def json_line(obj) -> str:
    """``obj`` as one line of strict JSON (a ``metrics.jsonl`` record): non-finite numbers as ``null``, never
    the bare ``NaN``/``Infinity`` that Python's json writes and other JSON readers refuse."""
    return json.dumps(nulled(obj), allow_nan=False)
