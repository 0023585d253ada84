"""Megatron-style tensor parallelism of a model's own layers, in place (parameter names unchanged).

Over a group of T ranks (``group``: ``size``, ``rank``, ``all_reduce``, ``all_gather``; the runtime's
:class:`~hyperparallel.runtime.tensor_group.TensorGroup`):

* :func:`copy_to` (Megatron's *f*): identity forward, all-reduce of the gradient backward, at the input of a
  block whose first linears are column-parallel (each rank's partial input gradient is summed);
* :func:`reduce_from` (*g*): all-reduce forward, identity backward, at the output of a row-parallel linear
  (each rank's partial sum is summed; every rank then holds the same output and the same gradient of it).

The backward all-reduce is a gradient hook on the tape (``Tensor.register_hook``): a ``Cell`` with a custom
``bprop`` needs a top cell that the runtime's tape autograd (``run_backward`` after a plain forward) has not
(MindSpore 2.9, CPU: "The pointer[top_cell_] is null"); the hook fires once per backward, in B when the
input and weight gradients are split (measured).

:func:`parallel_block` wraps a block (attention, MLP) with *f* on its input and *g* on its output by swapping
its class for a subclass (same Cell, same parameters and names); :func:`split` keeps a parameter's slice;
:func:`vocab_embedding` and :func:`vocab_cross_entropy` are the vocabulary-parallel embedding and loss
(no rank ever holds the full logits; a vocabulary T does not divide is padded to a multiple of T, the padded
logits left out of the loss).
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops


def copy_to(x: Tensor, group) -> Tensor:
    """Megatron's f: ``x`` forward; backward, the gradient summed over the group."""
    y = x * 1.0
    y.register_hook(group.all_reduce)
    return y


def reduce_from(x: Tensor, group) -> Tensor:
    """Megatron's g: the sum of ``x`` over the group forward; backward, the gradient as it comes."""
    return x + ops.stop_gradient(group.all_reduce(x) - x)


def split(p, axis: int, group, parts: int = 0) -> None:
    """Keep this rank's slice of parameter ``p`` along ``axis``: the ``group.rank``-th of ``group.size`` equal
    slices, or with ``parts`` < size the ``rank // (size // parts)``-th of ``parts`` (a slice held by
    ``size // parts`` consecutive ranks: key/value heads replicated when there are fewer than ranks). A
    length ``parts`` does not divide is padded with zeros to ``parts`` x ceil(length / parts) first (a
    vocabulary padded to a multiple of T, as Megatron's ``make-vocab-size-divisible-by``)."""
    parts = parts or group.size
    whole = p.asnumpy()
    n, i = -(-whole.shape[axis] // parts), group.rank // (group.size // parts)
    if n * parts > whole.shape[axis]:
        pad = [(0, 0)] * whole.ndim
        pad[axis] = (0, n * parts - whole.shape[axis])
        whole = np.pad(whole, pad)
    part = np.take(whole, np.arange(i * n, (i + 1) * n), axis=axis)
    p.set_data(Tensor(np.ascontiguousarray(part), p.dtype), slice_shape=True)


def shared_copy(w: Tensor, group, parts: int, axis: int = 0) -> Tensor:
    """A weight slice held by ``size // parts`` ranks (:func:`split` with ``parts``), as the computation reads
    it: forward ``w``; backward, the gradients of every rank holding the same slice summed (each has only its
    own query heads' share). One all-reduce over the group: every rank puts its gradient at its slice's place
    in a whole-sized buffer of zeros and keeps its place of the sum."""
    i = group.rank // (group.size // parts)

    def hook(g):
        full = ops.concat([g if k == i else ops.zeros_like(g) for k in range(parts)], axis=axis)
        return ops.narrow(group.all_reduce(full), axis, i * g.shape[axis], g.shape[axis])
    y = w * 1.0
    y.register_hook(hook)
    return y


_WRAPPED: Dict[type, type] = {}


def parallel_block(cell, group, arg: str = "hidden_states") -> None:
    """Make ``cell`` (a block whose input linears are column-parallel and output linear row-parallel) run
    ``g(block(f(x)))``: ``x`` its first positional argument or keyword ``arg``; a tuple output has its first
    item reduced."""
    base = type(cell)
    if base not in _WRAPPED:
        def construct(self, *args, **kw):
            g = self._tp_group
            if args:
                args = (copy_to(args[0], g),) + args[1:]
            else:
                kw[arg] = copy_to(kw[arg], g)
            out = base.construct(self, *args, **kw)
            if isinstance(out, tuple):
                return (reduce_from(out[0], g),) + out[1:]
            return reduce_from(out, g)
        _WRAPPED[base] = type(f"TensorParallel{base.__name__}", (base,), {"construct": construct})
    cell.__class__ = _WRAPPED[base]
    cell._tp_group = group


def vocab_embedding(ids: Tensor, weight, lo: int, padding_idx, group) -> Tensor:
    """The rows ``[lo, lo + rows)`` of a vocabulary-parallel embedding table: each rank looks up the ids it
    holds (zeros for the others) and the group sums; the padding row (if held here) gets no gradient."""
    rows = weight.shape[0]
    local = ids - lo
    held = ops.logical_and(local >= 0, local < rows)
    if padding_idx is not None and lo <= padding_idx < lo + rows:
        keep = np.ones((rows, 1), np.float32)
        keep[padding_idx - lo] = 0
        keep = Tensor(keep, weight.dtype)
        weight = weight * keep + ops.stop_gradient(weight) * (1 - keep)
    out = ops.gather(weight, ops.where(held, local, ops.zeros_like(local)), 0)
    return reduce_from(out * held.astype(out.dtype).expand_dims(-1), group)


def vocab_cross_entropy(logits: Tensor, labels: Tensor, lo: int, group, ignore_index: int = -100,
                        vocab: int = 0) -> Tensor:
    """Mean token cross entropy of a causal LM (labels shifted by one, ``ignore_index`` left out: the loss
    of mindone's ``ForCausalLMLoss``) from this rank's vocabulary slice of the logits (``[..., V/T]``, columns
    ``lo..``): log-sum-exp and the target logit are summed over the group (per-token numbers, never the
    logits); the gradient of each slice is its own softmax minus its one-hot part. ``vocab``: the real
    vocabulary size of a padded one: the columns from it on (padding rows of the LM head) are left out of
    the loss (no probability, no gradient)."""
    V = logits.shape[-1]
    logits = logits[:, :-1, :].reshape(-1, V).astype(ms.float32)
    if vocab and lo + V > vocab:   # padded columns: out of the softmax (their rows get no gradient)
        real = Tensor((np.arange(lo, lo + V) < vocab).reshape(1, V))
        logits = ops.where(real, logits, ops.full_like(logits, -1e30))
    target = labels[:, 1:].reshape(-1)
    # a common shift: the largest logit of any rank (no gradient: log-sum-exp does not depend on it)
    local_max = ops.stop_gradient(logits.max(axis=-1))
    shift = ops.stack(group.all_gather(local_max), 0).max(axis=0)
    sum_exp = reduce_from(ops.exp(logits - shift.expand_dims(-1)).sum(axis=-1), group)
    local_t = target - lo
    held = ops.logical_and(local_t >= 0, local_t < V)
    picked = ops.gather_elements(logits, 1, ops.where(held, local_t, ops.zeros_like(local_t)).reshape(-1, 1))
    target_logit = reduce_from(picked.reshape(-1) * held.astype(logits.dtype), group)
    valid = (target != ignore_index).astype(logits.dtype)
    nll = (ops.log(sum_exp) + shift - target_logit) * valid
    return nll.sum() / valid.sum()
