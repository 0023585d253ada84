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


def gather_whole(comm, values: dict, sharded: dict) -> dict:
    """``values`` ({parameter name: tensor of this rank}) with every tensor split over the tensor-parallel group
    (``sharded``: {name: axis}) gathered whole, in name order (a collective: every rank of the group calls it
    with the same names). Unsplit tensors pass as they are."""
    if not sharded or getattr(comm, "T", 1) == 1:
        return dict(values)
    out = dict(values)
    for name in sorted(n for n in values if n in sharded):
        out[name] = ops.concat(comm.all_gather(ops.stop_gradient(values[name]), "tp"), axis=sharded[name])
    return out


def with_state(sharded: dict, per: dict) -> dict:
    """``sharded`` ({parameter name: axis}) with the optimizer state of each such parameter (``per``: {parameter
    name: its state names}, :meth:`~.optim.Optimizer.state_groups`): a moment has its parameter's shape and split."""
    out = dict(sharded)
    for name, axis in sharded.items():
        out.update({s: axis for s in per.get(name, [])})
    return out


def whole_shape(shape, axis: int, size: int) -> tuple:
    """The shape of the whole tensor of which ``shape`` is one of ``size`` slices along ``axis``."""
    s = list(shape)
    s[axis] *= size
    return tuple(s)


def my_slice(value, axis: int, size: int, index: int):
    """Slice ``index`` of ``size`` equal slices of a whole tensor ``value`` along ``axis``."""
    n = value.shape[axis] // size
    return ops.narrow(value, axis, index * n, n)
