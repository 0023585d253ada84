"""Adapter of the project's tiny MLLM (ViT-style encoder + projector, decoder-only LLM).

Regions ``vision`` and ``llm``; their depths are ``model.vision_layers`` and
``model.llm_layers``. The sizes the data imply (vocabulary, patch size, number of
patches, sequence length) come from the data source. The encoder is the shared ViT
(:mod:`.vit`); its cells live in :mod:`.cells`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List

from ..base import Region
from ..vit import LLM, REGION as VISION, VitConfig, VitLLMAdapter
from ...errors import SpecError, unknown_key, whole



@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny MLLM (recipe ``model:``); vocab and sequence shapes come from the data."""

    vision_layers: int = 2
    llm_layers: int = 4
    vision_dim: int = 32
    vision_heads: int = 2
    llm_dim: int = 32
    llm_heads: int = 2
    mlp_ratio: int = 2
    vocab: int = 32
    patch_dim: int = 48
    num_patches: int = 4
    seq_len: int = 24
    init_std: float = 0.02


# keys the recipe may set (the rest are implied by the data)
RECIPE_KEYS = ("type", "vision_layers", "llm_layers", "vision_dim", "vision_heads", "llm_dim", "llm_heads",
               "mlp_ratio", "init_std")


class TinyMLLM(VitLLMAdapter):
    family = "tiny_mllm"

    def __init__(self, section: dict, data_shapes: dict, seed: int):
        sec = dict(section or {})
        bad = sorted(set(sec) - set(RECIPE_KEYS))
        if bad:
            raise unknown_key("model", sec, RECIPE_KEYS, "for the tiny MLLM")
        sec.pop("type", None)
        known = {f.name for f in fields(ModelConfig)}
        self.cfg = ModelConfig(**{k: v for k, v in data_shapes.items() if k in known}, **sec)
        for key in ("vision_layers", "llm_layers", "vision_dim", "llm_dim", "vision_heads", "llm_heads", "mlp_ratio"):
            v = getattr(self.cfg, key)
            whole(f"model.{key}", v)
            if v > 1 << 20:
                raise SpecError(f"model.{key}", f"{v} is above the bound {1 << 20:,}")
        std = self.cfg.init_std
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not 0 < std < 1e3:
            raise SpecError("model.init_std", f"must be a number > 0, got {std!r}")
        for dim, heads in (("vision_dim", "vision_heads"), ("llm_dim", "llm_heads")):
            if getattr(self.cfg, dim) % getattr(self.cfg, heads):
                raise SpecError(f"model.{heads}", f"must divide model.{dim}")
        self.seed = int(seed)

    def regions(self) -> List[Region]:
        return [Region(VISION, int(self.cfg.vision_layers), "model.vision_layers"),
                Region(LLM, int(self.cfg.llm_layers), "model.llm_layers")]

    @property
    def vit(self) -> VitConfig:
        c = self.cfg
        return VitConfig(layers=c.vision_layers, dim=c.vision_dim, heads=c.vision_heads, mlp_ratio=c.mlp_ratio,
                         patch_dim=c.patch_dim, num_patches=c.num_patches, out_dim=c.llm_dim, init_std=c.init_std)

    @property
    def seq_len(self) -> int:
        return self.cfg.seq_len

    @property
    def llm_width(self) -> int:
        return self.cfg.llm_dim

    def build_llm_chunk(self, start: int, stop: int):
        from ..cells import TinyLLMChunk
        return TinyLLMChunk(self.cfg, start, stop, self.seed)

    def tensors(self, micro_batch, loss_scale: float):
        from ..cells import MicroTensors
        return MicroTensors(micro_batch, loss_scale)
