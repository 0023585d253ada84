"""The data-source contract: what the runtime reads a step's micro-batches from.

A source answers, for optimizer step ``step`` and global micro-batch index ``micro`` (over all
data-parallel groups), ``micro_batch(step, micro)``: text, targets and the shape facts at once,
pixels only when first read. Everything else has a default here, so the runtime never probes a
source for what it can do:

* ``position(step)`` / ``seek(position, step)``: the data position where a step starts (stored with
  a checkpoint) and its inverse (resume);
* ``loss_tokens(step, micro)``: the micro-batch's answer tokens (the positions its loss is a mean
  over), from the index, for ``train.loss_normalization: tokens`` (:mod:`.loss_norm`);
* ``encoder_work(step)`` / ``balance_by(owners)``: per-sample encoder work of a step and the
  per-step sample assignment (``data.balance: encoder``, :mod:`.balance`); only sources that know
  each sample's encoder work have them;
* ``will_read_pixels(micros)``: a read-ahead hint, the global micro-batches of every step whose pixels
  this process will read (the ranks that run the encoder's first chunk);
* ``skipped``: samples left out (``data.on_bad_sample: skip``); ``stats``: counters for the logs;
* ``close()``: stop background work (decode threads).
"""
from __future__ import annotations

from typing import Dict, Sequence
from ..errors import SpecError


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

    def loss_tokens(self, step: int, micro: int) -> int:
        """Answer tokens of a micro-batch; default: the micro-batch's own ``loss_tokens`` (text only,
        pixels are not loaded)."""
        mb = self.micro_batch(step, micro)
        n = getattr(mb, "loss_tokens", None)
        if n is None:
            raise SpecError("train.loss_normalization", f"tokens needs each micro-batch's answer-token count, and "
                            f"{type(mb).__name__} has no loss_tokens; give it one or set "
                            "train.loss_normalization: micro_batch")
        return int(n)

    def step_counts(self, step: int):
        """{"samples", "real_tokens"} of step ``step`` (samples trained, their positions without padding) where
        the source knows them from its index, else None (``metrics.jsonl``'s ``samples`` / ``real_tokens``)."""
        return None

    #: does the source know each sample's encoder work (``data.balance: encoder`` possible)?
    has_encoder_work = False

    def will_read_pixels(self, micros: Sequence[int]) -> None:
        """Read-ahead hint (see the module docstring); default: nothing to prepare."""

    @property
    def stats(self) -> Dict:
        return {"skipped": int(self.skipped)}

    def close(self) -> None:
        """Stop background work; default: none."""
