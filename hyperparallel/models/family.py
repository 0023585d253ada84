"""A model family's registry entry: what selects it in a recipe's ``model:`` section, and its adapter.

A family is one folder, ``hyperparallel/models/<name>/`` (or any importable package), whose
``__init__.py`` defines ``FAMILY = Family(...)`` and registers the data layouts it owns
(:func:`hyperparallel.data.formats.register`); :data:`hyperparallel.models.FAMILIES` lists the packages,
one line each. The package's ``__init__`` stays pure Python (no MindSpore): it is imported to pick
an adapter before any rank starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Family:
    """``adapter``: ``"module:Class"``, imported only when chosen, called as
    ``Class(model_section, data_shapes, seed)``; ``types``: the ``model.type`` values naming it (the
    project's own models); ``archs``: the MindFormers ``model.arch.type`` / ``model.model_config.type``
    classes it trains (MindFormers' own and mindone.transformers' models)."""

    name: str
    adapter: str
    types: Tuple[str, ...] = ()
    archs: Tuple[str, ...] = ()
