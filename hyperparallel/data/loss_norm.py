"""How a step's micro-batch losses add up to the step loss (``train.loss_normalization``).

A model's last chunk returns its micro-batch's loss, the mean over that micro-batch's answer tokens,
times the micro-batch's *loss scale*; the step loss is the sum of those over every micro-batch of the
global batch (all data-parallel replicas). The scales:

* ``tokens`` (default): ``n_g / N``, with ``n_g`` the answer tokens of micro-batch ``g`` and ``N``
  those of the whole global batch, so the step loss is the mean over every answer token of the step
  and the loss and gradients depend only on which samples the step holds, not on how they are grouped
  into micro-batches (what the field uses for accumulated steps: the per-micro-batch mean
  over-weights the tokens of short samples);
* ``micro_batch``: ``1 / G`` for the ``G`` micro-batches: the mean of the micro-batch means.

The counts come from the data source's index (:meth:`~.source.DataSource.loss_tokens`, no pixels, no
communication), so every rank and the single-process reference compute the same scales.
"""
from __future__ import annotations

from typing import List

from ..errors import SpecError


def loss_scales(source, step: int, total_micro: int, mode: str) -> List[float]:
    """The loss scale of each global micro-batch ``0 .. total_micro - 1`` of step ``step``."""
    if mode == "micro_batch":
        return [1.0 / total_micro] * total_micro
    if mode != "tokens":
        raise SpecError("train.loss_normalization", f"{mode!r} unknown; allowed: tokens, micro_batch")
    counts = [int(source.loss_tokens(step, g)) for g in range(total_micro)]
    total = sum(counts)
    if total <= 0:
        raise RuntimeError(f"data: step {step} has no answer token in any of its {total_micro} micro-batches "
                           "(nothing to take the loss over)")
    return [n / total for n in counts]
