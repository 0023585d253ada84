"""Model adapters: the seam between the runtime and a model family (see :mod:`.base`).

``adapter_for(model_section, data_shapes, seed)`` picks the adapter a recipe's
``model:`` section asks for, pure Python (no MindSpore import), so ``train``,
``profile`` and ``bench`` refuse a model they cannot build before any rank starts:

* ``model.arch.type`` / ``model.model_config.type`` (a MindFormers model section):
  the MindFormers families registered in ``MINDFORMERS_ARCHS`` and mindone.transformers' VLMs
  (``MINDONE_ARCHS``: Qwen2.5-VL, Qwen3-VL, with Hugging Face configs);
* ``model.adapter: "package.module:Class"``: a user's own adapter class, called as
  ``Class(model_section, data_shapes, seed)``;
* otherwise ``model.type`` (default ``tiny_mllm``): the project's own models.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict

from .base import ModelAdapter, Region, TensorSpec
from ..errors import SpecError

# family name -> "module:Class" (imported only when chosen)
BUILTIN: Dict[str, str] = {"tiny_mllm": "hyperparallel.models.tiny_mllm.adapter:TinyMLLM"}
# MindFormers ``model.arch.type`` -> "module:Class"
MINDFORMERS_ARCHS: Dict[str, str] = {"LlamaForCausalLM": "hyperparallel.models.mf_llama.adapter:MFLlamaMLLM"}
# mindone.transformers class -> "module:Class"
MINDONE_ARCHS: Dict[str, str] = {a: "hyperparallel.models.qwen_vl.adapter:QwenVL" for a in
                                 ("Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration")}


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
        archs = dict(MINDFORMERS_ARCHS, **MINDONE_ARCHS)
        if arch not in archs:
            raise SpecError(key, f"{arch!r} has no runtime adapter, so it cannot be trained here (supported: "
                                 f"{', '.join(sorted(archs))}; plan and simulate still work)")
        return _load(archs[arch], key)(sec, data_shapes, seed)
    if "adapter" in sec:
        path = sec.pop("adapter")
        if not isinstance(path, str) or ":" not in path:
            raise SpecError("model.adapter", f"expected 'package.module:Class', got {path!r}")
        adapter = _load(path, "model.adapter")(sec, data_shapes, seed)
        if not isinstance(adapter, ModelAdapter):
            raise SpecError("model.adapter", f"{path} is not a hyperparallel.models.ModelAdapter")
        return adapter
    family = sec.get("type", "tiny_mllm")
    if family not in BUILTIN:
        raise SpecError("model.type", f"{family!r} unknown (known: {', '.join(sorted(BUILTIN))}; "
                         f"a MindFormers model needs model.arch.type)")
    return _load(BUILTIN[family], "model.type")(sec, data_shapes, seed)


__all__ = ["ModelAdapter", "Region", "TensorSpec", "adapter_for", "BUILTIN", "MINDFORMERS_ARCHS", "MINDONE_ARCHS"]
