"""Communication for one rank: pipeline-device addressing over MindSpore collectives.

Global rank layout is stage-major, as MindSpore/MindFormers use, with the T tensor-parallel ranks of a
stage replica innermost (neighbours: one node on Ascend):
``global = (device * D + dp_index) * T + tp_index``; pipeline group (i, t) = {(d*D + i)*T + t},
data-parallel group of device d = {(d*D + j)*T + tp_index}, tensor-parallel group = {(d*D + i)*T + t}.
With T = 1 this is ``device * D + dp_index``. The interpreter speaks in pipeline devices; this
module maps them to global ranks and to communication groups. Every tensor-parallel rank runs the
same program as its group's other ranks, talking to the same tp_index of its peers.

On MCCL all traffic between two processes shares one FIFO channel (tags ignored),
so calls must happen in the order the programs give; nothing here reorders.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops
import mindspore.mint.distributed as dist
from mindspore.communication import GlobalComm

from . import compat


class Comm:
    def __init__(self, data_parallel: int):
        from mindspore.communication import init
        compat.comm_timeouts()   # MCCL's 30 s receive timeout, raised before init() reads it (CPU)
        init()  # backend from the device: MCCL on CPU, HCCL on Ascend
        compat.fix_default_comm_group()
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._groups: Dict[Tuple[int, ...], str] = {}
        self._place(int(data_parallel), 1)

    def _place(self, D: int, T: int) -> None:
        self.D, self.T = D, T
        self.device, self.dp_index, self.tp_index = self.rank // (D * T), (self.rank // T) % D, self.rank % T

    def with_data_parallel(self, data_parallel: int, tensor_parallel: int = 1) -> "Comm":
        """This rank's communication under another data- (and tensor-) parallel degree (one launch runs cases
        of several layouts): the same process group and subgroups, another device / dp_index / tp_index."""
        D, T = int(data_parallel), int(tensor_parallel)
        if (D, T) == (self.D, self.T):
            return self
        if D < 1 or T < 1 or self.world % (D * T):
            raise RuntimeError(f"data_parallel {D} x model_parallel {T} does not divide the job's {self.world} ranks")
        import copy
        c = copy.copy(self)   # the subgroup cache (by global-rank tuples) is shared
        c._place(D, T)
        return c

    # -- addressing ---------------------------------------------------------
    def global_rank(self, device: int) -> int:
        return (int(device) * self.D + self.dp_index) * self.T + self.tp_index

    def dp_ranks(self) -> Tuple[int, ...]:
        return tuple((self.device * self.D + j) * self.T + self.tp_index for j in range(self.D))

    def tp_ranks(self) -> Tuple[int, ...]:
        """The tensor-parallel group of this rank: its stage replica's T neighbours."""
        base = (self.device * self.D + self.dp_index) * self.T
        return tuple(range(base, base + self.T))

    def ranks_of(self, group) -> Tuple[int, ...]:
        if group == "dp":
            return self.dp_ranks()
        if group == "tp":
            return self.tp_ranks()
        return tuple(sorted(self.global_rank(d) for d in group))

    def ensure_groups(self, all_groups: Iterable[Tuple[int, ...]]) -> None:
        """Create the subgroups this rank belongs to, in one global order on every rank."""
        for ranks in sorted(set(tuple(sorted(g)) for g in all_groups)):
            if len(ranks) == self.world or ranks in self._groups or self.rank not in ranks:
                continue
            if len(ranks) == 1:
                self._groups[ranks] = ""
                continue
            self._groups[ranks] = dist.new_group(list(ranks))

    def group_name(self, ranks: Tuple[int, ...]) -> str:
        if len(ranks) == self.world:
            return GlobalComm.WORLD_COMM_GROUP
        return self._groups[tuple(sorted(ranks))]

    # -- point to point -------------------------------------------------------
    def send(self, t: Tensor, peer_device: int) -> None:
        dist.send(t, self.global_rank(peer_device))

    def recv(self, shape: Sequence[int], peer_device: int, dtype: str = "float32") -> Tensor:
        buf = ops.zeros(tuple(shape), getattr(ms, dtype))
        dist.recv(buf, self.global_rank(peer_device))
        return buf

    # -- collectives (flat buffers: one call per action) ------------------------
    def all_reduce(self, tensors: List[Tensor], group) -> List[Tensor]:
        ranks = self.ranks_of(group)
        if len(ranks) == 1 or not tensors:
            return tensors
        flat = ops.concat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.group_name(ranks))
        return _split(flat, tensors)

    def broadcast(self, tensors: List[Tensor], root_device: int, group) -> List[Tensor]:
        ranks = self.ranks_of(group)
        if len(ranks) == 1 or not tensors:
            return tensors
        flat = ops.concat([t.reshape(-1) for t in tensors])
        dist.broadcast(flat, self.global_rank(root_device), group=self.group_name(ranks))
        return _split(flat, tensors)

    def all_gather(self, t: Tensor, group) -> List[Tensor]:
        """[t of every member of ``group``], in global-rank order (equal shapes; a sharded optimizer's slices)."""
        ranks = self.ranks_of(group)
        if len(ranks) == 1:
            return [t]
        out = [ops.zeros(t.shape, t.dtype) for _ in ranks]
        dist.all_gather(out, t, group=self.group_name(ranks))
        return out

    def reduce_scatter(self, flat: Tensor, group) -> Tensor:
        """This rank's slice of the sum of ``flat`` over ``group`` (``flat``: equal slices, one per member, in
        global-rank order; ZeRO-2's gradients). Through :func:`.compat.reduce_scatter` (emulated on CPU)."""
        ranks = self.ranks_of(group)
        if len(ranks) == 1:
            return flat
        return compat.reduce_scatter(flat, len(ranks), ranks.index(self.rank), self.group_name(ranks))

    def all_reduce_scalar(self, value: float) -> float:
        """Sum of one float over all ranks (metrics only, after every program has ended)."""
        return self.all_reduce_values([value])[0]

    def all_reduce_values(self, values) -> list:
        """Sums of a few floats over all ranks, in one all-reduce (float32, as the step loss always was; the gradient
        norm's square)."""
        t = Tensor(np.array(values, np.float32))
        dist.all_reduce(t)
        return [float(v) for v in t.asnumpy()]

    def all_gather_object(self, obj) -> list:
        """[obj of every rank] (picklable objects; checkpoint name checks)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        compat.barrier()


class LocalComm:
    """The communication of a one-device program in one process (no msrun peers): the bench's tight-loop
    profile and any in-process rank. Every collective is the identity; there is no point-to-point."""

    D, T, device, dp_index, tp_index, world = 1, 1, 0, 0, 0, 1

    def __init__(self, rank: int = 0):
        self.rank = rank

    def ensure_groups(self, groups) -> None:
        pass

    def all_reduce(self, tensors: List[Tensor], group) -> List[Tensor]:
        return tensors

    def broadcast(self, tensors: List[Tensor], root_device: int, group) -> List[Tensor]:
        return tensors

    def all_gather(self, t: Tensor, group) -> List[Tensor]:
        return [t]

    def reduce_scatter(self, flat: Tensor, group) -> Tensor:
        return flat

    def all_reduce_scalar(self, value: float) -> float:
        return float(value)

    def all_reduce_values(self, values) -> list:
        return [float(v) for v in values]

    def all_gather_object(self, obj) -> list:
        return [obj]

    def barrier(self) -> None:
        pass

    def send(self, *args, **kw):
        raise RuntimeError("LocalComm: a one-device program sends nothing")

    recv = send


def _split(flat: Tensor, like: List[Tensor]) -> List[Tensor]:
    out, off = [], 0
    for t in like:
        n = int(np.prod(t.shape)) if t.shape else 1
        out.append(flat[off:off + n].reshape(t.shape))
        off += n
    return out
