"""Data sources: what the runtime trains on (recipe ``data:``; ``data.type`` picks the source).

Every source is a :class:`~.source.DataSource` (the contract: ``micro_batch(step, micro)`` ->
:class:`~.batch.MicroBatch`, text, targets and shape facts at once, pixels only when ``patches``
is first read; data position and seek for resume; a pixel read-ahead hint; stats). A
micro-batch is a pure function of (seed, step, micro) and the data position, so a resumed run
reads the next samples.

Types: ``synthetic`` (default; :mod:`.synthetic`) and ``conversations``
(LLaVA-style JSON/JSONL with image files; :mod:`.conversations`).
"""
from __future__ import annotations

from .batch import MicroBatch, patchify
from .source import DataSource
from .synthetic import DataConfig, SyntheticSource, make_micro_batch
from ..mpipe.errors import SpecError

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
    raise SpecError("data.type", f"{kind!r} unknown (known: {', '.join(TYPES)})")


def data_source(cfg, seed: int, image_tokens) -> DataSource:
    """The source of a data config (:func:`data_config`); ``image_tokens()``: LLM tokens per image
    (the model adapter's), read only by sources that lay out conversations."""
    if isinstance(cfg, DataConfig):
        return SyntheticSource(cfg, seed)
    from .conversations import ConversationsSource
    return ConversationsSource(cfg, image_tokens(), seed)


__all__ = ["DataSource", "MicroBatch", "patchify", "DataConfig", "SyntheticSource", "make_micro_batch", "data_config",
           "data_source", "TYPES"]
