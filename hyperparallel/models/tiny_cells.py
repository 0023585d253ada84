"""Cells of the tiny multimodal LLM, built chunk by chunk (adapter: :mod:`.tiny_mllm`).

Regions, in data-flow order:

* ``vision``: a ViT-style encoder. Chunk 0 owns the patch embedding (+ position
  embedding); the last chunk owns mean pooling over patches and the projector MLP
  (one token of LLM width per image).
* ``llm``: a decoder-only LLM (pre-norm blocks: RMSNorm, causal attention, MLP).
  Chunk 0 owns the token embedding and merges image tokens into the sequence;
  the last chunk owns final norm, LM head and the cross-entropy loss.

Every parameter is initialised from ``(seed, region, layer, name)`` only, so any
cut of the layers into chunks, on any rank, yields the same values as the
single-process reference; parameter names are global (``llm.3.attn.wq``).
"""
from __future__ import annotations

import math
import zlib
from typing import List, Optional

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .tiny_mllm import LLM, VISION, ModelConfig

def _rng(seed: int, region: str, layer: int, name: str) -> np.random.Generator:
    key = zlib.crc32(f"{region}/{layer}/{name}".encode())
    return np.random.default_rng([int(seed), key])


class _Init:
    """Parameter factory bound to one (seed, region, layer): deterministic per name."""

    def __init__(self, seed: int, region: str, layer: int, std: float, registry: list):
        self.seed, self.region, self.layer, self.std = seed, region, layer, std
        self.registry = registry

    def _make(self, name: str, value: np.ndarray) -> Parameter:
        full = f"{self.region}.{self.layer}.{name}"
        p = Parameter(Tensor(value.astype(np.float32)), name=full)
        self.registry.append((p, full))  # Cell prefixes names on attach; restored after build
        return p

    def normal(self, name: str, shape, std: Optional[float] = None) -> Parameter:
        v = _rng(self.seed, self.region, self.layer, name).standard_normal(shape) * (std or self.std)
        return self._make(name, v)

    def const(self, name: str, shape, value: float) -> Parameter:
        return self._make(name, np.full(shape, value, np.float32))


class RMSNorm(nn.Cell):
    def __init__(self, init: _Init, name: str, dim: int):
        super().__init__()
        self.g = init.const(f"{name}.g", (dim,), 1.0)

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6) * self.g


class LayerNorm(nn.Cell):
    def __init__(self, init: _Init, name: str, dim: int):
        super().__init__()
        self.g = init.const(f"{name}.g", (dim,), 1.0)
        self.b = init.const(f"{name}.b", (dim,), 0.0)

    def construct(self, x):
        mu = x.mean(-1, keep_dims=True)
        var = ((x - mu) ** 2).mean(-1, keep_dims=True)
        return (x - mu) * ops.rsqrt(var + 1e-5) * self.g + self.b


class Attention(nn.Cell):
    def __init__(self, init: _Init, dim: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.wq = init.normal("attn.wq", (dim, dim))
        self.wk = init.normal("attn.wk", (dim, dim))
        self.wv = init.normal("attn.wv", (dim, dim))
        self.wo = init.normal("attn.wo", (dim, dim))

    def construct(self, x):
        n, t, d = x.shape
        h = self.heads
        hd = d // h

        def split(w):
            return ops.matmul(x, w).reshape(n, t, h, hd).transpose(0, 2, 1, 3)
        q, k, v = split(self.wq), split(self.wk), split(self.wv)
        s = ops.matmul(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
        if self.causal:
            mask = Tensor(np.triu(np.full((t, t), -1e9, np.float32), 1))
            s = s + mask
        a = ops.softmax(s, -1)
        o = ops.matmul(a, v).transpose(0, 2, 1, 3).reshape(n, t, d)
        return ops.matmul(o, self.wo)


class MLP(nn.Cell):
    def __init__(self, init: _Init, name: str, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.w1 = init.normal(f"{name}.w1", (d_in, d_hidden))
        self.b1 = init.const(f"{name}.b1", (d_hidden,), 0.0)
        self.w2 = init.normal(f"{name}.w2", (d_hidden, d_out))
        self.b2 = init.const(f"{name}.b2", (d_out,), 0.0)

    def construct(self, x):
        return ops.matmul(ops.gelu(ops.matmul(x, self.w1) + self.b1), self.w2) + self.b2


class Block(nn.Cell):
    """Pre-norm transformer block (LayerNorm for vision, RMSNorm for the LLM)."""

    def __init__(self, init: _Init, dim: int, heads: int, ratio: int, causal: bool):
        super().__init__()
        norm = RMSNorm if causal else LayerNorm
        self.n1 = norm(init, "n1", dim)
        self.attn = Attention(init, dim, heads, causal)
        self.n2 = norm(init, "n2", dim)
        self.mlp = MLP(init, "mlp", dim, dim * ratio, dim)

    def construct(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class PatchEmbed(nn.Cell):
    """Linear patch embedding plus learned positions (first vision chunk)."""

    def __init__(self, init: _Init, cfg: ModelConfig, dim: int):
        super().__init__()
        self.w = init.normal("patch.w", (cfg.patch_dim, dim))
        self.b = init.const("patch.b", (dim,), 0.0)
        self.pos = init.normal("patch.pos", (cfg.num_patches, dim))

    def construct(self, x):
        return ops.matmul(x, self.w) + self.b + self.pos


class TokenMerge(nn.Cell):
    """Token embedding; image tokens and text embeddings scattered into the sequence by the data's index."""

    def __init__(self, init: _Init, cfg: ModelConfig, dim: int):
        super().__init__()
        self.cfg = cfg
        self.tok = init.normal("embed.tok", (cfg.vocab, dim), std=1.0)
        self.pos = init.normal("embed.pos", (cfg.seq_len, dim))

    def construct(self, img, mb):
        cfg = self.cfg
        text = ops.gather(self.tok, mb.text_ids, 0)
        table = ops.concat([ops.zeros((1, cfg.llm_dim), ms.float32), img, text], 0)
        seq = ops.gather(table, mb.merge_index, 0).reshape(-1, cfg.seq_len, cfg.llm_dim)
        return seq + self.pos


class LMHead(nn.Cell):
    """Final norm, LM head and the masked cross-entropy of the micro-batch (last llm chunk)."""

    def __init__(self, init: _Init, cfg: ModelConfig, dim: int):
        super().__init__()
        self.norm = RMSNorm(init, "final_norm", dim)
        self.w = init.normal("head.w", (dim, cfg.vocab))

    def construct(self, x, mb):
        logits = ops.matmul(self.norm(x), self.w)
        logp = ops.log_softmax(logits, -1)
        ce = -(logp * mb.onehot).sum(-1)
        return (ce * mb.mask).sum() / mb.mask.sum() * mb.loss_scale


class ChunkCell(nn.Cell):
    """Layers [start, stop) of one region, plus the region's head/tail parts it owns.

    ``forward(x, mb)`` takes the chunk input (patches for vision chunk 0, image
    features for llm chunk 0, else the previous chunk's output) and the micro-batch
    tensors ``mb`` (:class:`hyperparallel.mindspore.data.MicroTensors`). The last
    llm chunk returns the micro-batch loss times ``loss_scale``.
    """

    def __init__(self, cfg: ModelConfig, region: str, start: int, stop: int, seed: int):
        super().__init__()
        self.region, self.start, self.stop = region, start, stop
        n_layers = cfg.vision_layers if region == VISION else cfg.llm_layers
        self.first, self.last = start == 0, stop == n_layers
        self.cfg = cfg
        std = cfg.init_std
        reg: list = []
        if region == VISION:
            dim, heads, causal = cfg.vision_dim, cfg.vision_heads, False
        elif region == LLM:
            dim, heads, causal = cfg.llm_dim, cfg.llm_heads, True
        else:
            raise ValueError(f"unknown region {region!r} (the tiny MLLM has 'vision' and 'llm')")
        self.blocks = nn.CellList([Block(_Init(seed, region, i, std, reg), dim, heads, cfg.mlp_ratio, causal)
                                   for i in range(start, stop)])
        if region == VISION and self.first:
            self.patch = PatchEmbed(_Init(seed, region, -1, std, reg), cfg, dim)
        if region == VISION and self.last:
            init = _Init(seed, region, n_layers, std, reg)
            self.proj = MLP(init, "projector", dim, cfg.llm_dim * cfg.mlp_ratio, cfg.llm_dim)
        if region == LLM and self.first:
            self.embed = TokenMerge(_Init(seed, region, -1, std, reg), cfg, dim)
        if region == LLM and self.last:
            self.head = LMHead(_Init(seed, region, n_layers, std, reg), cfg, dim)
        for p, full in reg:
            p.name = full

    def forward(self, x, mb):
        if self.region == VISION:
            if self.first:
                x = self.patch(x)
            for blk in self.blocks:
                x = blk(x)
            if self.last:
                x = self.proj(x.mean(1))
            return x
        if self.first:
            x = self.embed(x, mb)
        for blk in self.blocks:
            x = blk(x)
        if self.last:
            x = self.head(x, mb)
        return x


def build_full(cfg: ModelConfig, seed: int) -> List[ChunkCell]:
    """The whole model as one chunk per region (the reference's model)."""
    return [ChunkCell(cfg, VISION, 0, cfg.vision_layers, seed),
            ChunkCell(cfg, LLM, 0, cfg.llm_layers, seed)]
