"""Data sources: what the runtime trains on (recipe ``data:``; ``data.type`` picks the source).

Every source is a :class:`~.source.DataSource` (the contract: ``micro_batch(step, micro)`` ->
:class:`~.batch.MicroBatch`, text, targets and shape facts at once, pixels only when ``patches``
is first read; data position and seek for resume; a pixel read-ahead hint; stats). A
micro-batch is a pure function of (seed, step, micro) and the data position, so a resumed run
reads the next samples.

Types (:data:`TYPES`, one line each; a type's config derives from :class:`~.config.DataSection`):
``synthetic`` (default; :mod:`.synthetic`) and ``conversations`` (LLaVA-style JSON/JSONL with image
files; :mod:`.conversations`), laid out as the model's ``data_format()`` asks: the layout registry
(:mod:`.formats`) holds ``merge_index`` (:mod:`.merge_index`, :class:`~.batch.MicroBatch`) and the
layouts model families register (``hyperparallel/models/<family>/``).
"""
from __future__ import annotations

import importlib
from typing import Dict

from . import merge_index  # noqa: F401  (registers the merge_index layout)
from .batch import MicroBatch, patchify
from .config import DataSection
from .source import DataSource
from .synthetic import DataConfig, SyntheticSource, make_micro_batch
from ..errors import SpecError

# data.type -> "module:Class" of its config (a DataSection; imported when chosen): one line per source
TYPES: Dict[str, str] = {
    "synthetic": "hyperparallel.data.synthetic:DataConfig",
    "conversations": "hyperparallel.data.conversations_config:ConversationsConfig",
}


def data_config(raw: dict) -> DataSection:
    """The ``data:`` section of a raw recipe as a config object; ValueError('data.<key>: ...')."""
    sec = dict(raw.get("data") or {})
    kind = sec.pop("type", "synthetic")
    if not isinstance(kind, str) or kind not in TYPES:
        raise SpecError("data.type", f"{kind!r} unknown (known: {', '.join(TYPES)})")
    mod, _, cls = TYPES[kind].partition(":")
    return getattr(importlib.import_module(mod), cls).from_recipe(sec, raw)


def data_source(cfg: DataSection, seed: int, data_format) -> DataSource:
    """The source of a data config (:func:`data_config`); ``data_format()``: the model adapter's
    micro-batch layout (a dict, :mod:`.formats`), called only by sources that lay out conversations."""
    return cfg.source(seed, data_format)


__all__ = ["DataSource", "DataSection", "MicroBatch", "patchify", "DataConfig", "SyntheticSource", "make_micro_batch",
           "data_config", "data_source", "TYPES"]
