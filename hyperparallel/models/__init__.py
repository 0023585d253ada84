"""Model adapters: the seam between the runtime and a model family (see :mod:`.base`).

A family is one folder (``models/<name>/``: its adapter, cells, side inputs, CPU patches and data
layout), listed in :data:`FAMILIES` by one line; its ``__init__`` says what selects it
(:class:`~.family.Family`) and registers its data layouts. ``adapter_for(model_section, data_shapes,
seed)`` picks the adapter a recipe's ``model:`` section asks for, pure Python (no MindSpore import),
so ``train``, ``profile`` and ``bench`` refuse a model they cannot build before any rank starts:

* ``model.arch.type`` / ``model.model_config.type`` (a MindFormers model section): a family's
  ``archs`` (MindFormers' Llama; mindone.transformers' Qwen2.5-VL and Qwen3-VL, with Hugging Face
  configs);
* ``model.adapter: "package.module:Class"``: a user's own adapter class, called as
  ``Class(model_section, data_shapes, seed)``;
* otherwise ``model.type`` (default ``tiny_mllm``): a family's ``types`` (the project's own models).
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List

from .base import ModelAdapter, Region, TensorSpec
from .family import Family
from ..errors import SpecError

# the model families: one package each (its __init__ defines FAMILY and registers its data layouts)
FAMILIES = (
    "hyperparallel.models.tiny_mllm",
    "hyperparallel.models.mf_llama",
    "hyperparallel.models.qwen_vl",
)


def families() -> List[Family]:
    """The :data:`FAMILIES` entries (importing a family's package registers its data layouts)."""
    out = []
    for path in FAMILIES:
        fam = getattr(importlib.import_module(path), "FAMILY", None)
        if not isinstance(fam, Family):
            raise TypeError(f"{path}: a model family's package defines FAMILY = Family(...)")
        out.append(fam)
    return out


def model_types() -> Dict[str, str]:
    """``model.type`` -> "module:Class"."""
    return {t: f.adapter for f in families() for t in f.types}


def archs() -> Dict[str, str]:
    """MindFormers ``model.arch.type`` -> "module:Class"."""
    return {a: f.adapter for f in families() for a in f.archs}


families()   # every family's data layout is registered once the models are imported


def _load(path: str, key: str) -> Callable:
    mod, _, cls = path.partition(":")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"{key}", f"cannot import {path!r} ({e})") from None


def adapter_for(section: dict, data_shapes: dict, seed: int) -> ModelAdapter:
    """The adapter for a recipe's ``model:`` section; ValueError('model.<key>: ...') if none fits."""
    sec = dict(section or {})
    if {"arch", "model_config", "config", "pretrained"} & set(sec):
        arch = (sec.get("arch") or {}).get("type") if isinstance(sec.get("arch"), dict) else None
        key = "model.arch.type"
        if arch is None:
            arch = (sec.get("model_config") or {}).get("type") if isinstance(sec.get("model_config"), dict) else None
            key = "model.model_config.type"
        known = archs()
        if arch not in known:
            raise SpecError(key, f"{arch!r} has no runtime adapter, so it cannot be trained here (supported: "
                                 f"{', '.join(sorted(known))}; plan and simulate still work)")
        return _load(known[arch], key)(sec, data_shapes, seed)
    if "adapter" in sec:
        path = sec.pop("adapter")
        if not isinstance(path, str) or ":" not in path:
            raise SpecError("model.adapter", f"expected 'package.module:Class', got {path!r}")
        adapter = _load(path, "model.adapter")(sec, data_shapes, seed)
        if not isinstance(adapter, ModelAdapter):
            raise SpecError("model.adapter", f"{path} is not a hyperparallel.models.ModelAdapter")
        return adapter
    family = sec.get("type", "tiny_mllm")
    known = model_types()
    if family not in known:
        raise SpecError("model.type", f"{family!r} unknown (known: {', '.join(sorted(known))}; "
                         f"a MindFormers model needs model.arch.type)")
    return _load(known[family], "model.type")(sec, data_shapes, seed)


__all__ = ["ModelAdapter", "Region", "TensorSpec", "Family", "FAMILIES", "families", "adapter_for", "archs",
           "model_types"]
