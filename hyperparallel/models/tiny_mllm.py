"""Adapter of the project's tiny MLLM (ViT-style encoder + projector, decoder-only LLM).

Regions ``vision`` and ``llm``; their depths are ``model.vision_layers`` and
``model.llm_layers``. The sizes the data imply (vocabulary, patch size, number of
patches, sequence length) come from the data source. The Cells live in
:mod:`.tiny_cells`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List

from .base import ModelAdapter, Region, TensorSpec

VISION = "vision"
LLM = "llm"


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


class TinyMLLM(ModelAdapter):
    family = "tiny_mllm"

    def __init__(self, section: dict, data_shapes: dict, seed: int):
        sec = dict(section or {})
        bad = sorted(set(sec) - set(RECIPE_KEYS))
        if bad:
            raise ValueError(f"model.{bad[0]}: unknown key for the tiny MLLM (known: {', '.join(RECIPE_KEYS)})")
        sec.pop("type", None)
        known = {f.name for f in fields(ModelConfig)}
        self.cfg = ModelConfig(**{k: v for k, v in data_shapes.items() if k in known}, **sec)
        for key in ("vision_layers", "llm_layers", "vision_dim", "llm_dim", "vision_heads", "llm_heads", "mlp_ratio"):
            if int(getattr(self.cfg, key)) < 1:
                raise ValueError(f"model.{key}: must be >= 1")
        for dim, heads in (("vision_dim", "vision_heads"), ("llm_dim", "llm_heads")):
            if getattr(self.cfg, dim) % getattr(self.cfg, heads):
                raise ValueError(f"model.{heads}: must divide model.{dim}")
        self.seed = int(seed)

    def regions(self) -> List[Region]:
        return [Region(VISION, int(self.cfg.vision_layers), "model.vision_layers"),
                Region(LLM, int(self.cfg.llm_layers), "model.llm_layers")]

    def build_chunk(self, region: str, start: int, stop: int):
        from .tiny_cells import ChunkCell
        return ChunkCell(self.cfg, region, start, stop, self.seed)

    def tensors(self, micro_batch, loss_scale: float):
        from hyperparallel.mindspore.data import MicroTensors
        return MicroTensors(micro_batch, loss_scale)

    def model_input(self, tensors):
        return tensors.patches

    def image_tokens(self) -> int:
        return 1   # the encoder pools its patches into one LLM-width token per image

    def boundary(self, region: str, stop: int, micro_batch) -> TensorSpec:
        cfg = self.cfg
        if region == LLM:
            return TensorSpec((len(micro_batch.images_per_sample), cfg.seq_len, cfg.llm_dim))
        return vit_boundary(stop, micro_batch, cfg.vision_layers, cfg.num_patches, cfg.vision_dim, cfg.llm_dim)


def vit_boundary(stop: int, micro_batch, layers: int, num_patches: int, width: int, out_dim: int) -> TensorSpec:
    """Output of the ViT encoder's chunk ending at layer ``stop`` (the encoder of the tiny MLLM and of
    the MindFormers Llama MLLM): patch tokens of every image, or after the last layer one projected
    token of LLM width per image."""
    n = micro_batch.num_images
    if stop == layers:
        return TensorSpec((n, out_dim))
    return TensorSpec((n, num_patches, width))
