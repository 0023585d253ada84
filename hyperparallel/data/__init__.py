"""Data sources: what the runtime trains on (recipe ``data:``; ``data.type`` picks the source).

Every source is a :class:`~.source.DataSource` (the contract: ``micro_batch(step, micro)`` ->
:class:`~.batch.MicroBatch`, text, targets and shape facts at once, pixels only when ``patches``
is first read; data position and seek for resume; a pixel read-ahead hint; stats). A
micro-batch is a pure function of (seed, step, micro) and the data position, so a resumed run
reads the next samples.

Types: ``synthetic`` (default; :mod:`.synthetic`) and ``conversations``
(LLaVA-style JSON/JSONL with image files; :mod:`.conversations`), laid out as the model's
``data_format()`` asks (:mod:`.formats`: ``merge_index`` -> :class:`~.batch.MicroBatch`,
``qwen_vl`` -> :class:`~.batch.QwenVLBatch`).
"""
from __future__ import annotations

from .batch import MicroBatch, QwenVLBatch, patchify
from .source import DataSource
from .synthetic import DataConfig, SyntheticSource, make_micro_batch
from ..errors import SpecError

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


def data_source(cfg, seed: int, data_format) -> DataSource:
    """The source of a data config (:func:`data_config`); ``data_format()``: the model adapter's
    micro-batch layout (a dict, :mod:`.formats`), called only by sources that lay out conversations."""
    if isinstance(cfg, DataConfig):
        return SyntheticSource(cfg, seed)
    from .formats import QWEN_VL
    fmt = cfg.check_format(data_format)
    if fmt.name == QWEN_VL:
        from ..models.qwen_vl.source import QwenVLSource
        return QwenVLSource(cfg, fmt, seed)
    from .conversations import ConversationsSource
    return ConversationsSource(cfg, fmt, seed)


__all__ = ["DataSource", "MicroBatch", "QwenVLBatch", "patchify", "DataConfig", "SyntheticSource", "make_micro_batch",
           "data_config", "data_source", "TYPES"]
