"""The data-source contract: what the runtime reads a step's micro-batches from.

A source answers, for optimizer step ``step`` and global micro-batch index ``micro`` (over all
data-parallel groups), ``micro_batch(step, micro)``: text, targets and the shape facts at once,
pixels only when first read. Everything else has a default here, so the runtime never probes a
source for what it can do:

* ``position(step)`` / ``seek(position, step)``: the data position where a step starts (stored with
  a checkpoint) and its inverse (resume);
* ``will_read_pixels(micros)``: a read-ahead hint, the global micro-batches of every step whose pixels
  this process will read (the ranks that run the encoder's first chunk);
* ``skipped``: samples left out (``data.on_bad_sample: skip``); ``stats``: counters for the logs;
* ``close()``: stop background work (decode threads).
"""
from __future__ import annotations

from typing import Dict, Sequence
from ..mpipe.errors import SpecError


class DataSource:
    """Base class of data sources (see the module docstring)."""

    skipped: int = 0

    def micro_batch(self, step: int, micro: int):
        raise NotImplementedError

    def position(self, step: int) -> Dict:
        """Where step ``step`` starts; default: the step itself (a source that is a pure function of it)."""
        return {"step": int(step)}

    def seek(self, position: Dict, step: int) -> None:
        """Make step ``step`` start at ``position``; default: only the position of that very step."""
        if int(position.get("step", step)) != int(step):
            raise SpecError("data", f"data position {position} cannot start step {step}")

    def will_read_pixels(self, micros: Sequence[int]) -> None:
        """Read-ahead hint (see the module docstring); default: nothing to prepare."""

    @property
    def stats(self) -> Dict:
        return {"skipped": int(self.skipped)}

    def close(self) -> None:
        """Stop background work; default: none."""
