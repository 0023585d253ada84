"""The project's ViT encoder, one module for every adapter that uses it (the tiny MLLM and the
MindFormers Llama MLLM): patch embedding + position embedding with the first chunk, pre-norm
blocks (LayerNorm, full attention, MLP), mean pooling over the patches and a projector MLP to the
LLM width with the last chunk (one LLM token per image).

:class:`VitConfig` is pure Python; :class:`~.cells.VitChunk` builds the MindSpore cells.
Parameter names: ``vision.<layer>.<name>`` (patch embedding at layer -1, projector at layer
``layers``), identical whichever chunk holds them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import ModelAdapter, TensorSpec

REGION = "vision"
LLM = "llm"


@dataclass(frozen=True)
class VitConfig:
    """Sizes of the encoder; ``patch_dim`` / ``num_patches`` come from the data, ``out_dim`` is the LLM width."""

    layers: int
    dim: int
    heads: int
    mlp_ratio: int
    patch_dim: int
    num_patches: int
    out_dim: int
    init_std: float = 0.02

    def boundary(self, stop: int, micro_batch) -> TensorSpec:
        """Output of the chunk ending at layer ``stop``: every image's patch tokens, or after the last
        layer one projected token of LLM width per image (the shapes come from the image count only)."""
        n = micro_batch.num_images
        if stop == self.layers:
            return TensorSpec((n, self.out_dim))
        return TensorSpec((n, self.num_patches, self.dim))


class VitLLMAdapter(ModelAdapter):
    """What the adapters built on this encoder share (the tiny MLLM, the MindFormers Llama MLLM): regions
    ``vision`` then ``llm``; one pooled token per image, spliced into a fixed-length LLM sequence by the
    data's merge index. A subclass gives ``vit`` (:class:`VitConfig`), ``seed``, ``seq_len``,
    ``llm_width``, ``build_llm_chunk(start, stop)`` and ``tensors``."""

    def build_chunk(self, region: str, start: int, stop: int):
        if not 0 <= start < stop <= self.depth(region):
            raise ValueError(f"{self.family}: layers [{start}, {stop}) outside region {region!r} "
                             f"(0..{self.depth(region)})")
        if region == REGION:
            from .cells import VitChunk
            return VitChunk(self.vit, start, stop, self.seed)
        return self.build_llm_chunk(start, stop)

    def compile_reason(self, region: str) -> str:
        """Every chunk compiles: the encoder's and the LLM's chunk Cells give tensor-only bodies."""
        self.depth(region)   # KeyError for a region the model lacks
        return ""

    def model_input(self, tensors):
        return tensors.patches

    def image_tokens(self) -> int:
        return 1   # the encoder pools its patches into one LLM-width token per image

    def boundary(self, region: str, stop: int, micro_batch) -> TensorSpec:
        if region == LLM:
            return TensorSpec((len(micro_batch.images_per_sample), self.seq_len, self.llm_width))
        return self.vit.boundary(stop, micro_batch)
