"""Micro-batch layouts a model can ask for: the model adapter's ``data_format()`` answer, checked, and the
registry of layouts keyed by its ``format`` name.

A layout (:class:`Layout`) is registered by whoever owns it: ``merge_index`` by the data layer
(:mod:`.merge_index`: every image placeholder becomes ``image_tokens`` rows of the encoder's output,
gathered by a merge index, :class:`~.batch.MicroBatch`), every other one by its model family's folder
(``hyperparallel/models/<family>/__init__.py``, e.g. ``qwen_vl``), so the data layer never names a model.
An entry says how to check the answer (``resolve``), how to index a conversations file (``index``) and
which source yields the micro-batches (``source``), plus the ``data:`` keys only it reads.

A bad answer is the model adapter's fault: SpecError('model', ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

from ..errors import SpecError, is_whole

MERGE_INDEX = "merge_index"


def _none(*_):
    return None


def _no_defaults(_sec: dict) -> dict:
    return {}


@dataclass(frozen=True)
class Layout:
    """One micro-batch layout (see the module docstring).

    * ``resolve(answer)``: the checked format (a frozen object with ``name``) of a ``data_format()`` dict;
    * ``index(cfg, fmt, tok)``: the conversations index layout (``parse``, ``decode_check``, :mod:`.index`);
    * ``source(cfg, fmt, seed)``: the :class:`~.source.DataSource` of a conversations config;
    * ``keys``: the ``data:`` keys only this layout reads (refused for a model of another layout);
      ``defaults()``: fresh defaults of those of them the conversations config does not hold as its own
      fields (kept in ``ConversationsConfig.layout_keys``); ``file_defaults(section)``: defaults read from
      a file the section names (explicit keys win); ``validate(cfg)``: refuses a bad value of its keys (every
      conversations config, before the model is known); ``check(cfg, fmt)``: once the model's format is known.
    """

    name: str
    resolve: Callable[[dict], Any]
    index: Callable
    source: Callable
    keys: Tuple[str, ...] = ()
    defaults: Callable[[], Dict[str, Any]] = dict
    file_defaults: Callable[[dict], Dict[str, Any]] = _no_defaults
    validate: Callable = _none
    check: Callable = _none


LAYOUTS: Dict[str, Layout] = {}


def register(layout: Layout) -> Layout:
    """Add ``layout`` under its name (a second registration of the same entry is a no-op; another entry
    under a taken name is refused: two families cannot both own a format)."""
    have = LAYOUTS.get(layout.name)
    if have is not None and have != layout:
        raise ValueError(f"data layout {layout.name!r} is registered twice")
    LAYOUTS[layout.name] = layout
    return layout


def layout_of(fmt) -> Layout:
    """The registry entry of a resolved format."""
    return LAYOUTS[fmt.name]


def resolve_format(answer):
    """The checked format of ``answer``: a zero-argument callable (called here), a dict
    ``{"format": NAME, ...}`` of a registered layout, an already resolved format, or an int
    (shorthand for merge_index)."""
    if callable(answer):
        answer = answer()
    if not isinstance(answer, dict) and getattr(answer, "name", None) in LAYOUTS:
        return answer
    if is_whole(answer):
        answer = {"format": MERGE_INDEX, "image_tokens": answer}
    if not isinstance(answer, dict):
        raise SpecError("model", f"data_format() must return a dict, got {type(answer).__name__}")
    kind = answer.get("format")
    if kind not in LAYOUTS:
        raise SpecError("model", f"data_format() format {kind!r} unknown (known: {', '.join(LAYOUTS)})")
    return LAYOUTS[kind].resolve(answer)


__all__ = ["Layout", "LAYOUTS", "MERGE_INDEX", "register", "layout_of", "resolve_format"]
