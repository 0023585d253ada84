"""Tensor parallelism of mindone's Qwen2.5-VL and Qwen3-VL language models, in place (:mod:`.tensor_parallel`).

Over T ranks, after the whole network is built (its weights identical on every rank: one seed, or one
pretrained directory), each rank keeps:

* attention: the q/k/v rows of its ``num_attention_heads / T`` query heads and ``num_key_value_heads / T``
  key/value heads (biases too; the grouping of query heads onto key/value heads stays rank-local; with
  T > ``num_key_value_heads`` the one key/value head its query heads read, held by T / kv ranks, whose
  gradients of it are summed), the
  matching columns of ``o_proj``; the attention module runs ``g(attn(f(x)))``;
* MLP: the rows of ``gate_proj`` / ``up_proj`` and the columns of ``down_proj`` of its ``intermediate_size / T``
  channels; ``g(mlp(f(x)))``;
* ``embed_tokens`` and ``lm_head``: its ``vocab_size / T`` rows (a vocabulary T does not divide padded with
  zero rows to the next multiple of T, as Megatron's ``make-vocab-size-divisible-by``; the padded logits are
  left out of the loss and checkpoints hold the unpadded tensors); the embedding looks up the ids it holds and
  the group sums, the LM head gives this rank's logit columns, and the loss is the vocabulary-parallel cross
  entropy (:func:`.tensor_parallel.vocab_cross_entropy`).

Norms and the vision encoder stay whole on every rank (the encoder is replicated within the group: its input
is the same and the gradient reaching it is the same on every rank, so the copies stay equal without any
collective). Parameter names are unchanged; :func:`sharded` lists the split ones with their axes.
"""
from __future__ import annotations

from typing import Dict

from .. import tensor_parallel as tp

ATTN = (("q_proj.weight", 0), ("q_proj.bias", 0), ("k_proj.weight", 0), ("k_proj.bias", 0),
        ("v_proj.weight", 0), ("v_proj.bias", 0), ("o_proj.weight", 1))
MLP = (("gate_proj.weight", 0), ("up_proj.weight", 0), ("down_proj.weight", 1))
EMBED, HEAD = "model.language_model.embed_tokens.weight", "lm_head.weight"


def sharded(num_layers: int, size: int, kv_heads: int, vocab: int = 0) -> Dict[str, object]:
    """{parameter name: spec} of every parameter split over a group of ``size``: an axis (one slice per rank), or
    for k/v when ``size`` > ``kv_heads`` (axis, ``kv_heads``): each key/value head held by ``size // kv_heads``
    ranks; the embedding and LM head of a ``vocab`` that ``size`` does not divide (0, size, vocab): padded
    with zero rows to a multiple of ``size`` (:func:`~hyperparallel.runtime.tensor_group.split_of`)."""
    v = 0 if not vocab or vocab % size == 0 else (0, size, vocab)
    out = {EMBED: v, HEAD: v}
    for i in range(num_layers):
        pre = f"model.language_model.layers.{i}."
        out.update({pre + "self_attn." + n: (a if size <= kv_heads or n[0] not in "kv" else (a, kv_heads))
                    for n, a in ATTN})
        out.update({pre + "mlp." + n: a for n, a in MLP})
    return out


def shard_network(net, group, num_heads: int, kv_heads: int, vocab: int = 0) -> None:
    """Split ``net``'s language model over ``group`` in place (see the module docstring)."""
    lm = net.model.language_model
    params = {p.name: p for p in net.get_parameters()}
    for name, spec in sharded(len(lm.layers), group.size, kv_heads, vocab).items():
        if name in params:   # a bias the config leaves out
            axis, parts = (spec, 0) if isinstance(spec, int) else spec[:2]   # a padded vocabulary: (0, T, V)
            tp.split(params[name], axis, group, parts)
    local_q, local_kv = num_heads // group.size, max(1, kv_heads // group.size)
    for layer in lm.layers:
        layer.self_attn.num_key_value_groups = local_q // local_kv   # query heads per key/value head, here
        if group.size > kv_heads:   # each key/value head on several ranks: their gradients summed
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                _shared_kv(proj, group, kv_heads)
        tp.parallel_block(layer.self_attn, group)
        tp.parallel_block(layer.mlp, group, arg="x")
        for norm in ("q_norm", "k_norm"):   # Qwen3-VL
            if hasattr(layer.self_attn, norm):
                _head_norm(getattr(layer.self_attn, norm), group)
    rows = lm.embed_tokens.weight.shape[0]
    _vocab_embedding(lm.embed_tokens, group, group.rank * rows)
    _column_head(net.lm_head, group)


_CLASSES: Dict[tuple, type] = {}


def _swap(cell, kind: str, construct) -> None:
    key = (type(cell), kind)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"{kind}{type(cell).__name__}", (type(cell),), {"construct": construct})
    cell.__class__ = _CLASSES[key]


def _vocab_embedding(cell, group, lo: int) -> None:
    def construct(self, input):
        return tp.vocab_embedding(input, self.weight, self._tp_lo, self.padding_idx, self._tp_group)
    _swap(cell, "VocabParallel", construct)
    cell._tp_group, cell._tp_lo = group, lo


def _column_head(cell, group) -> None:
    base = type(cell)

    def construct(self, x):
        return base.construct(self, tp.copy_to(x, self._tp_group))
    _swap(cell, "ColumnParallel", construct)
    cell._tp_group = group


def _shared_kv(cell, group, parts: int) -> None:
    """A k/v projection whose head slice ``size // parts`` ranks hold: its weight and bias through
    :func:`.tensor_parallel.shared_copy`."""
    from mindspore import mint

    def construct(self, x):
        g, n = self._tp_group, self._tp_parts
        b = None if self.bias is None else tp.shared_copy(self.bias, g, n)
        return mint.nn.functional.linear(x, tp.shared_copy(self.weight, g, n), b)
    _swap(cell, "SharedHead", construct)
    cell._tp_group, cell._tp_parts = group, parts


def _head_norm(cell, group) -> None:
    """An RMS norm over ``head_dim`` applied to this rank's heads only: the same computation with its weight
    passed through *f* (its gradient summed over the group's heads)."""
    import mindspore as ms
    from mindspore import mint

    def construct(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(ms.float32)
        h = h * mint.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return tp.copy_to(self.weight, self._tp_group) * h.to(dtype)
    _swap(cell, "HeadParallel", construct)
    cell._tp_group = group
