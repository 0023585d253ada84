"""The tensor-parallel group of one rank, as a model adapter sees it (``ModelAdapter.shard``).

A stage replica's T neighbouring ranks (:class:`~.comm.Comm`'s layout) each hold 1/T of the sharded layers and
sum their partial results with these collectives. They are called inside chunk forwards and backwards, which
the T ranks run in one order (the same program): on MCCL's one FIFO channel per pair nothing else passes
between two ranks of a group, so their collectives stay paired.
"""
from __future__ import annotations

from typing import List

from mindspore import Tensor, ops


class TensorGroup:
    """``size`` ranks, this one ``rank``; ``all_reduce`` (sum) and ``all_gather`` (in rank order) over them,
    out of place and outside the tape (the adapter's cells give them their backward)."""

    def __init__(self, comm):
        self.comm, self.size, self.rank = comm, int(comm.T), int(comm.tp_index)

    def all_reduce(self, t: Tensor) -> Tensor:
        return self.comm.all_reduce([ops.stop_gradient(t)], "tp")[0]

    def all_gather(self, t: Tensor) -> List[Tensor]:
        return self.comm.all_gather(ops.stop_gradient(t), "tp")


def split_of(spec, size: int):
    """(axis, parts) of a sharded-parameter spec: an axis (``size`` slices, one per rank), (axis, parts) with
    parts < ``size`` (each slice held by ``size // parts`` consecutive ranks: key/value heads replicated), or
    (axis, parts, length): a whole tensor of ``length`` along ``axis`` that ``parts`` does not divide, padded
    with zeros to ``parts`` x ceil(length / parts) (a vocabulary padded to a multiple of T; :func:`length_of`)."""
    return (spec, size) if isinstance(spec, int) else (int(spec[0]), int(spec[1]))


def length_of(spec):
    """The whole (unpadded) length along the split axis of a padded spec (:func:`split_of`), else None."""
    return None if isinstance(spec, int) or len(spec) < 3 else int(spec[2])


def first_copy(spec, size: int, index: int) -> bool:
    """Whether rank ``index`` of the group holds the first copy of its slice (each slice counts once)."""
    _, parts = split_of(spec, size)
    return index % (size // parts) == 0


def gather_whole(comm, values: dict, sharded: dict) -> dict:
    """``values`` ({parameter name: tensor of this rank}) with every tensor split over the tensor-parallel group
    (``sharded``: {name: spec}, :func:`split_of`) gathered whole, in name order (a collective: every rank of the
    group calls it with the same names). Unsplit tensors pass as they are."""
    T = getattr(comm, "T", 1)
    if not sharded or T == 1:
        return dict(values)
    out = dict(values)
    for name in sorted(n for n in values if n in sharded):
        axis, parts = split_of(sharded[name], T)
        got = comm.all_gather(ops.stop_gradient(values[name]), "tp")
        whole = ops.concat(got[::T // parts], axis=axis)
        n = length_of(sharded[name])
        out[name] = whole if n is None else ops.narrow(whole, axis, 0, n)   # the padding left out
    return out


def with_state(sharded: dict, per: dict) -> dict:
    """``sharded`` ({parameter name: axis}) with the optimizer state of each such parameter (``per``: {parameter
    name: its state names}, :meth:`~.optim.Optimizer.state_groups`): a moment has its parameter's shape and split."""
    out = dict(sharded)
    for name, axis in sharded.items():
        out.update({s: axis for s in per.get(name, [])})
    return out


def whole_shape(shape, spec, size: int) -> tuple:
    """The shape of the whole tensor of which ``shape`` is this rank's slice (``spec``: :func:`split_of`)."""
    axis, parts = split_of(spec, size)
    s = list(shape)
    n = length_of(spec)
    s[axis] = s[axis] * parts if n is None else n
    return tuple(s)


def my_slice(value, spec, size: int, index: int):
    """Rank ``index``'s slice of a whole tensor ``value`` (``spec``: :func:`split_of`; a padded spec's zero
    padding added first)."""
    axis, parts = split_of(spec, size)
    length = length_of(spec)
    if length is not None:
        n = -(-length // parts)
        if n * parts > value.shape[axis]:
            pad = list(value.shape)
            pad[axis] = n * parts - value.shape[axis]
            value = ops.concat([value, ops.zeros(tuple(pad), value.dtype)], axis=axis)
    n = value.shape[axis] // parts
    return ops.narrow(value, axis, index // (size // parts) * n, n)
