"""Data sources: what the runtime trains on (recipe ``data:``; ``data.type`` picks the source).

A source answers, for optimizer step ``step`` and global micro-batch index ``micro``
(over all data-parallel groups):

* ``micro_batch(step, micro)`` -> :class:`~.batch.MicroBatch`: text, targets and the
  shape facts (images per sample) at once, pixels only when ``patches`` is first read;
* ``meta(step, micro)``: the same object, for ranks that need only the shape facts;
* ``position(step)`` / ``seek(position, step)``: the data position where a step starts
  (stored with a checkpoint) and its inverse; a micro-batch is a pure function of
  (seed, step, micro) and that position, so a resumed run reads the next samples;
* ``skipped``: samples left out by ``data.on_bad_sample: skip`` (0 otherwise);
* optional ``will_read_pixels(micros)``: the micro-batches of each step whose pixels
  this process reads (a prefetch hint), and ``close()``.

Types: ``synthetic`` (default; :mod:`.synthetic`) and ``conversations``
(LLaVA-style JSON/JSONL with image files; :mod:`.conversations`).
"""
from __future__ import annotations

from .batch import MicroBatch, patchify
from .synthetic import DataConfig, SyntheticSource, make_micro_batch

TYPES = ("synthetic", "conversations")


def data_config(raw: dict):
    """The ``data:`` section of a raw recipe as a config object; ValueError('data.<key>: ...')."""
    sec = dict(raw.get("data") or {})
    kind = sec.pop("type", "synthetic")
    if kind == "synthetic":
        return DataConfig.from_section(sec)
    if kind == "conversations":
        from .conversations import ConversationsConfig
        pc = raw.get("parallel_config") or {}
        try:
            mps = int(pc.get("micro_batch_num", 1)) * int(pc.get("data_parallel", 1) or 1)
        except (TypeError, ValueError):
            mps = 1
        return ConversationsConfig.from_section(sec, max(1, mps))
    raise ValueError(f"data.type: {kind!r} unknown (known: {', '.join(TYPES)})")


def data_source(rc):
    """The data source a run config (model adapter, data config, train seed) asks for."""
    if isinstance(rc.data, DataConfig):
        return SyntheticSource(rc.data, rc.train.seed)
    from .conversations import ConversationsSource
    return ConversationsSource(rc.data, rc.model.image_tokens(), rc.train.seed)


__all__ = ["MicroBatch", "patchify", "DataConfig", "SyntheticSource", "make_micro_batch", "data_config",
           "data_source", "TYPES"]
