"""MindSpore cells of the project's own models: the building blocks, the ViT encoder chunk
(:mod:`.vit`), the tiny MLLM's LLM chunk (:mod:`.tiny_mllm.adapter`), and the micro-batch as tensors.

Every parameter is initialised from ``(seed, region, layer, name)`` only (:class:`Init`), so any
cut of the layers into chunks, on any rank, yields the same values as the single-process
reference; parameter names are global (``llm.3.attn.wq``, ``vision.0.mlp.w1``): layer ``-1``
is a region's input part (patch or token embedding), layer ``L`` (its depth) its output part.
Chunk cells carry ``region``, ``start`` and ``blocks`` (graph-mode annotation places every block).
"""
from __future__ import annotations

import math
import zlib
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

VISION, LLM = "vision", "llm"   # the regions (the adapters' names)


def _rng(seed: int, region: str, layer: int, name: str) -> np.random.Generator:
    key = zlib.crc32(f"{region}/{layer}/{name}".encode())
    return np.random.default_rng([int(seed), key])


class Init:
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
    def __init__(self, init: Init, name: str, dim: int):
        super().__init__()
        self.g = init.const(f"{name}.g", (dim,), 1.0)

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6) * self.g


class LayerNorm(nn.Cell):
    def __init__(self, init: Init, name: str, dim: int):
        super().__init__()
        self.g = init.const(f"{name}.g", (dim,), 1.0)
        self.b = init.const(f"{name}.b", (dim,), 0.0)

    def construct(self, x):
        mu = x.mean(-1, keep_dims=True)
        var = ((x - mu) ** 2).mean(-1, keep_dims=True)
        return (x - mu) * ops.rsqrt(var + 1e-5) * self.g + self.b


class Attention(nn.Cell):
    def __init__(self, init: Init, dim: int, heads: int, causal: bool):
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
    def __init__(self, init: Init, name: str, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.w1 = init.normal(f"{name}.w1", (d_in, d_hidden))
        self.b1 = init.const(f"{name}.b1", (d_hidden,), 0.0)
        self.w2 = init.normal(f"{name}.w2", (d_hidden, d_out))
        self.b2 = init.const(f"{name}.b2", (d_out,), 0.0)

    def construct(self, x):
        return ops.matmul(ops.gelu(ops.matmul(x, self.w1) + self.b1), self.w2) + self.b2


class Block(nn.Cell):
    """Pre-norm transformer block (LayerNorm for vision, RMSNorm for the LLM)."""

    def __init__(self, init: Init, dim: int, heads: int, ratio: int, causal: bool):
        super().__init__()
        norm = RMSNorm if causal else LayerNorm
        self.n1 = norm(init, "n1", dim)
        self.attn = Attention(init, dim, heads, causal)
        self.n2 = norm(init, "n2", dim)
        self.mlp = MLP(init, "mlp", dim, dim * ratio, dim)

    def construct(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


def named(registry: list) -> None:
    """Give every parameter of ``registry`` its global name back (a Cell prefixes names on attach)."""
    for p, full in registry:
        p.name = full


# -- the ViT encoder ---------------------------------------------------------------------------

class PatchEmbed(nn.Cell):
    """Linear patch embedding plus learned positions (first chunk)."""

    def __init__(self, init: Init, cfg):
        super().__init__()
        self.w = init.normal("patch.w", (cfg.patch_dim, cfg.dim))
        self.b = init.const("patch.b", (cfg.dim,), 0.0)
        self.pos = init.normal("patch.pos", (cfg.num_patches, cfg.dim))

    def construct(self, x):
        return ops.matmul(x, self.w) + self.b + self.pos


class VitChunk(nn.Cell):
    """Encoder layers ``[start, stop)``; ``forward(patches or tokens, batch)`` -> the chunk's output.
    ``region``, ``start`` and ``blocks`` let graph-mode annotation place every block."""

    def __init__(self, cfg, start: int, stop: int, seed: int):
        super().__init__()
        self.region, self.start, self.stop = VISION, start, stop
        self.first, self.last = start == 0, stop == cfg.layers
        reg: list = []
        self.blocks = nn.CellList([Block(Init(seed, VISION, i, cfg.init_std, reg), cfg.dim, cfg.heads,
                                         cfg.mlp_ratio, causal=False) for i in range(start, stop)])
        if self.first:
            self.patch = PatchEmbed(Init(seed, VISION, -1, cfg.init_std, reg), cfg)
        if self.last:
            self.proj = MLP(Init(seed, VISION, cfg.layers, cfg.init_std, reg), "projector", cfg.dim,
                            cfg.out_dim * cfg.mlp_ratio, cfg.out_dim)
        named(reg)

    def forward(self, x, batch=None):
        return self.graph_body(x)

    def graph_args(self, batch) -> tuple:
        """The side inputs of :meth:`graph_body`: none (an encoder chunk reads only its input)."""
        return ()

    def graph_body(self, x):
        """The chunk's computation on tensors only (what ``mindspore.jit`` compiles)."""
        if self.first:
            x = self.patch(x)
        for blk in self.blocks:
            x = blk(x)
        if self.last:
            x = self.proj(x.mean(1))
        return x


# -- the tiny MLLM's LLM -----------------------------------------------------------------------

class TokenMerge(nn.Cell):
    """Token embedding; image tokens and text embeddings scattered into the sequence by the data's index."""

    def __init__(self, init: Init, vocab: int, seq_len: int, dim: int):
        super().__init__()
        self.seq_len, self.dim = seq_len, dim
        self.tok = init.normal("embed.tok", (vocab, dim), std=1.0)
        self.pos = init.normal("embed.pos", (seq_len, dim))

    def construct(self, img, text_ids, merge_index):
        text = ops.gather(self.tok, text_ids, 0)
        table = ops.concat([ops.zeros((1, self.dim), ms.float32), img, text], 0)
        seq = ops.gather(table, merge_index, 0).reshape(-1, self.seq_len, self.dim)
        return seq + self.pos


class LMHead(nn.Cell):
    """Final norm, LM head and the masked cross-entropy of the micro-batch (last chunk)."""

    def __init__(self, init: Init, vocab: int, dim: int):
        super().__init__()
        self.norm = RMSNorm(init, "final_norm", dim)
        self.w = init.normal("head.w", (dim, vocab))

    def construct(self, x, onehot, mask, loss_scale):
        logits = ops.matmul(self.norm(x), self.w)
        logp = ops.log_softmax(logits, -1)
        ce = -(logp * onehot).sum(-1)
        return (ce * mask).sum() / mask.sum() * loss_scale


class TinyLLMChunk(nn.Cell):
    """LLM layers ``[start, stop)`` of the tiny MLLM (``cfg``: its ModelConfig). ``forward(x, mb)``:
    ``x`` is the image features (first chunk) or the previous chunk's hidden states; the last chunk
    returns the micro-batch loss times ``mb.loss_scale``."""

    def __init__(self, cfg, start: int, stop: int, seed: int):
        super().__init__()
        self.region, self.start, self.stop = LLM, start, stop
        self.first, self.last = start == 0, stop == cfg.llm_layers
        std, dim, reg = cfg.init_std, cfg.llm_dim, []
        self.blocks = nn.CellList([Block(Init(seed, LLM, i, std, reg), dim, cfg.llm_heads, cfg.mlp_ratio,
                                         causal=True) for i in range(start, stop)])
        if self.first:
            self.embed = TokenMerge(Init(seed, LLM, -1, std, reg), cfg.vocab, cfg.seq_len, dim)
        if self.last:
            self.head = LMHead(Init(seed, LLM, cfg.llm_layers, std, reg), cfg.vocab, dim)
        named(reg)

    def forward(self, x, mb):
        return self.graph_body(x, *self.graph_args(mb))

    def graph_args(self, mb) -> tuple:
        """The side inputs of :meth:`graph_body`: text ids and merge index (first chunk), targets, mask and
        loss scale (last chunk); None where the chunk reads nothing (the text ids' length varies with the
        images: only the first chunk's graph sees it)."""
        first = (mb.text_ids, mb.merge_index) if self.first else (None, None)
        last = (mb.onehot, mb.mask, mb.loss_scale_t) if self.last else (None, None, None)
        return first + last

    def graph_body(self, x, text_ids, merge_index, onehot, mask, loss_scale):
        """The chunk's computation on tensors only (what ``mindspore.jit`` compiles)."""
        if self.first:
            x = self.embed(x, text_ids, merge_index)
        for blk in self.blocks:
            x = blk(x)
        if self.last:
            x = self.head(x, onehot, mask, loss_scale)
        return x


# -- the micro-batch as tensors ------------------------------------------------------------------

class MicroTensors:
    """A MicroBatch as MindSpore tensors, plus the loss scale (:mod:`hyperparallel.data.loss_norm`).

    ``patches`` (the pixels) becomes a tensor, and is loaded, only when first read: the
    model's input chunk reads it; other chunks need the text side inputs only."""

    def __init__(self, mb, loss_scale: float):
        self.batch = mb
        self._patches = None
        self.text_ids = Tensor(mb.text_ids)
        self.merge_index = Tensor(mb.merge_index)
        self.onehot = Tensor(mb.onehot)
        self.mask = Tensor(mb.mask)
        self.loss_scale = float(loss_scale)
        # the scale as a graph input: a Python float reaching a jit graph is a constant, so every distinct
        # value (token counts vary per micro-batch on real data) would compile the last chunk again
        self.loss_scale_t = Tensor(np.float32(loss_scale))

    @property
    def patches(self):
        if self._patches is None:
            self._patches = Tensor(self.batch.patches)
        return self._patches
