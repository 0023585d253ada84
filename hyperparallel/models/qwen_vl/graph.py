"""Graph-ready forwards of mindone's Qwen2.5-VL / Qwen3-VL layers: what ``mindspore.jit`` compiles for a chunk
under ``mpipe.compile: jit`` (:mod:`hyperparallel.runtime.compiled`).

mindone's own ``construct`` methods do not compile under ``mindspore.jit`` (MindSpore 2.9.0, CPU): their
attention's torch-style ``Tensor.transpose(1, 2)`` is read as a full permutation in graph mode, the LLM rotary
embedding's ``expand(..., -1, 1)`` fails shape inference, and the vision attention splits the sequence by
``cu_seqlens.tolist()`` (host values). So these functions compute the same layers from the same cells (mindone's
``Linear`` sub-cells are called as they are; the norms are read from their ``weight`` / ``variance_epsilon``), with
graph-ready constructs:

* transposes as ``ops.swapaxes`` / explicit permutations;
* the rotary tables (``cos``, ``sin``) computed outside the graph, once per micro-batch (:mod:`.cells`'s
  ``QwenTensors``; Qwen2.5-VL's M-RoPE section selection included): they depend on the positions only;
* the vision attention over windows / images as one attention over all patches with an additive block-diagonal
  mask (``block_mask``, a graph input): the masked scores' ``exp`` is exactly 0 in float32, so each row's
  softmax is its window's; only the summation order differs (float32 rounding, measured below 1e-6).

The parameters and their names are the model's own (the functions read the chunk's mindone cells), so
checkpoints, LoRA-free training and the optimizer see exactly what eager sees. The eager path
(``forward``) still runs mindone's ``construct`` methods; tests/unit/test_qwen_vl_graph.py checks both agree
(outputs and gradients).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import ops

#: the additive mask value for positions a query may not see (exp of it underflows to exactly 0 in float32)
MASKED = -1e9


def block_mask(cu_seqlens) -> np.ndarray:
    """(N, N) float32 additive mask: 0 within each segment ``[cu[i], cu[i+1])``, :data:`MASKED` elsewhere."""
    cu = np.asarray(cu_seqlens, np.int64).reshape(-1)
    n = int(cu[-1])
    seg = np.zeros(n, np.int64)
    for i in range(len(cu) - 1):
        seg[cu[i]:cu[i + 1]] = i
    return np.where(seg[:, None] == seg[None, :], 0.0, MASKED).astype(np.float32)


def text_cos_sin(kind: str, rotary_emb, h, position_ids, mrope_section=None):
    """The LLM layers' rotary tables as the graph reads them, (B, 1, S, head_dim) each: mindone's
    ``rotary_emb(h, position_ids)`` (eager), then Qwen2.5-VL's M-RoPE section selection
    (``apply_multimodal_rotary_pos_emb``'s) and the head axis."""
    cos, sin = rotary_emb(h, position_ids)
    if kind == "qwen2_5_vl":
        sections = list(mrope_section) * 2
        cos = ops.concat([m[i % 3] for i, m in enumerate(ops.split(cos, sections, axis=-1))], axis=-1)
        sin = ops.concat([m[i % 3] for i, m in enumerate(ops.split(sin, sections, axis=-1))], axis=-1)
    return ops.expand_dims(cos, 1), ops.expand_dims(sin, 1)


def rms_norm(norm, x):
    """mindone's ``Qwen2RMSNorm`` / ``Qwen3VLTextRMSNorm``."""
    dtype = x.dtype
    h = x.astype(ms.float32)
    var = ops.mean(h * h, -1, keep_dims=True)
    return norm.weight * (h * ops.rsqrt(var + norm.variance_epsilon)).astype(dtype)


def layer_norm(norm, x):
    """``mint.nn.LayerNorm`` over the last axis (the CPU layer's ``ops.LayerNorm``)."""
    return ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=norm.eps)(x, norm.weight, norm.bias)[0]


def act(name: str, x):
    """The Hugging Face activation ``name`` (those the Qwen-VL configs use)."""
    if name == "silu":
        return ops.silu(x)
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return ops.gelu(x, approximate="tanh")
    if name == "gelu":
        return ops.gelu(x, approximate="none")
    raise ValueError(f"activation {name!r} has no graph form here")


def rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concat((-x[..., half:], x[..., :half]), axis=-1)


def gated_mlp(mlp, hidden_act: str, x):
    return mlp.down_proj(act(hidden_act, mlp.gate_proj(x)) * mlp.up_proj(x))


def attention(q, k, v, mask, scaling):
    """Scaled dot-product attention, (..., H, S, hd) inputs, ``mask`` additive (broadcast to the scores)."""
    w = ops.matmul(q, ops.swapaxes(k, -1, -2)) * scaling + mask
    w = ops.softmax(w.astype(ms.float32), axis=-1).astype(q.dtype)
    return ops.matmul(w, v)


def decoder_layer(kind: str, layer, hidden_act: str, h, mask, cos, sin):
    """One LLM decoder layer (``Qwen2_5_VLDecoderLayer`` / ``Qwen3VLTextDecoderLayer``): ``h`` (B, S, D),
    ``mask`` (B, 1, S, S) additive causal, ``cos`` / ``sin`` (B, 1, S, head_dim) (:func:`text_cos_sin`)."""
    attn = layer.self_attn
    x = rms_norm(layer.input_layernorm, h)
    B, S = x.shape[0], x.shape[1]
    hd = attn.head_dim
    q = attn.q_proj(x).reshape(B, S, -1, hd)
    k = attn.k_proj(x).reshape(B, S, -1, hd)
    v = attn.v_proj(x).reshape(B, S, -1, hd)
    if kind == "qwen3_vl":
        q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
    q, k, v = ops.swapaxes(q, 1, 2), ops.swapaxes(k, 1, 2), ops.swapaxes(v, 1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    n_rep = attn.num_key_value_groups
    if n_rep > 1:   # mindone's repeat_kv: each key/value head serves n_rep consecutive query heads
        kv, hd_ = k.shape[1], k.shape[3]
        k = ops.broadcast_to(ops.expand_dims(k, 2), (B, kv, n_rep, S, hd_)).reshape(B, kv * n_rep, S, hd_)
        v = ops.broadcast_to(ops.expand_dims(v, 2), (B, kv, n_rep, S, hd_)).reshape(B, kv * n_rep, S, hd_)
    o = attention(q, k, v, mask, attn.scaling)
    o = ops.swapaxes(o, 1, 2).reshape(B, S, -1)
    h = h + attn.o_proj(o)
    return h + gated_mlp(layer.mlp, hidden_act, rms_norm(layer.post_attention_layernorm, h))


def vision_block(kind: str, blk, hidden_act: str, h, mask, cos, sin):
    """One vision block (``Qwen2_5_VLVisionBlock`` / ``Qwen3VLVisionBlock``): ``h`` (N, Dv), ``mask`` (N, N)
    additive block-diagonal (:func:`block_mask` of the block's cu_seqlens), ``cos`` / ``sin`` (N, head_dim)."""
    attn = blk.attn
    x = rms_norm(blk.norm1, h) if kind == "qwen2_5_vl" else layer_norm(blk.norm1, h)
    N = x.shape[0]
    qkv = attn.qkv(x).reshape(N, 3, attn.num_heads, -1)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]                  # (N, H, hd)
    c, s = ops.expand_dims(cos, 1), ops.expand_dims(sin, 1)
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    q, k, v = ops.swapaxes(q, 0, 1), ops.swapaxes(k, 0, 1), ops.swapaxes(v, 0, 1)   # (H, N, hd)
    o = ops.swapaxes(attention(q, k, v, mask, attn.scaling), 0, 1).reshape(N, -1)
    h = h + attn.proj(o)
    if kind == "qwen2_5_vl":
        return h + gated_mlp(blk.mlp, hidden_act, rms_norm(blk.norm2, h))
    return h + blk.mlp.linear_fc2(act(hidden_act, blk.mlp.linear_fc1(layer_norm(blk.norm2, h))))


def embed(weight, ids, keep):
    """The CPU layer's ``Embedding`` (``ops.gather``); ``keep`` (V, 1) float: 0 on the ``padding_idx`` row, which
    then gets no gradient (torch's semantics), or None without a padding index."""
    if keep is not None:
        weight = weight * keep + ops.stop_gradient(weight) * (1 - keep)
    return ops.gather(weight, ids, 0)


def padding_keep(cell):
    """``keep`` of :func:`embed` for an ``Embedding`` cell (None when it has no ``padding_idx``)."""
    idx = getattr(cell, "padding_idx", None)
    if idx is None:
        return None
    keep = np.ones((cell.weight.shape[0], 1), np.float32)
    keep[idx] = 0
    return ms.Tensor(keep)


def scatter_rows(h, feats, rows):
    """(B, S, D) like ``h``: row k of ``feats`` where ``rows`` (B*S,) is k+1, zeros where it is 0 (the order of
    mindone's ``masked_scatter`` / ``_deepstack_process``; :func:`.side.image_rows`)."""
    B, S, D = h.shape
    table = ops.concat((ops.zeros((1, D), h.dtype), feats.astype(h.dtype)), axis=0)
    return ops.gather(table, rows, 0).reshape(B, S, D)


def shifted_targets(labels) -> tuple:
    """(targets, valid) of Hugging Face's causal-LM loss (``ForCausalLMLoss``: labels shifted left, -100 padded),
    flat (B*S,) int64 / float32 numpy: targets 0 where ignored."""
    lab = np.asarray(labels, np.int64)
    shifted = np.concatenate([lab[:, 1:], np.full((lab.shape[0], 1), -100, np.int64)], axis=1).reshape(-1)
    valid = shifted != -100
    return np.where(valid, shifted, 0).astype(np.int64), valid.astype(np.float32)


def causal_lm_loss(logits, targets, valid):
    """The mean token cross entropy of ``fixed_cross_entropy`` (reduction mean over the valid targets)."""
    V = logits.shape[-1]
    logp = ops.log_softmax(logits.astype(ms.float32).reshape(-1, V), -1)
    nll = -ops.gather_elements(logp, 1, targets.reshape(-1, 1)).reshape(-1)
    return (nll * valid).sum() / valid.sum()


def merger(kind: str, m, x):
    """A patch merger (``Qwen2_5_VLPatchMerger``; ``Qwen3VLVisionPatchMerger``, the deepstack ones too)."""
    if kind == "qwen2_5_vl":
        x = rms_norm(m.ln_q, x).reshape(-1, m.hidden_size)
        return m.mlp[2](ops.gelu(m.mlp[0](x), approximate=m.mlp[1].approximate))
    x = layer_norm(m.norm, x.reshape(-1, m.hidden_size) if m.use_postshuffle_norm else x).reshape(-1, m.hidden_size)
    return m.linear_fc2(ops.gelu(m.linear_fc1(x), approximate=m.act_fn.approximate))
