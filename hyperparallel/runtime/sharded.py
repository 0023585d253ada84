"""Sharded optimizer state of a replicated region (``transpose(optimizer=sharded)``, issue 23 part 4).

The region's parameters, in one order on every replica, are laid end to end in one flat vector of N
elements, padded to ``P x k`` (``k = ceil(N / P)``, P replicas). Replica i (its index in the replica
group) keeps the optimizer of the slice ``[i k, (i + 1) k)``: one flat Parameter ``shard.<region>``
and the same optimizer as the rest of the rank (:class:`~.optim.Optimizer`: Adam's moments are k
elements, not N; the ``train:`` section's Adam or SGD without weight decay, which treat every element
alike). :meth:`Shard.update` takes the slice of the current parameters and of the reduced
grads, steps the slice, all-gathers the updated slices from every replica and writes them back into
every parameter: every replica leaves the step with the same parameters as an unsharded run. The
update needs the step's gradients as the optimizer gets them (clipped by the global norm, known only
after the program), so it runs in the rank's optimizer step (:meth:`ShardedOptimizer.step`), right
after the program and at the same point on every replica; the plan's ``ALLGATHER`` marks that end of
the step for the checker and the cost model, and the interpreter does nothing there.

Checkpoints keep the global names: :class:`ShardedOptimizer` (the rank's optimizer) names in
``state()`` a full-shape ``<slot>.<param>`` entry for every sharded parameter's state (a shape only:
nothing of full size is kept between saves), gathers those from the replicas when a checkpoint is
saved (:meth:`ShardedOptimizer.before_save`) and loads such names into its share
(:meth:`ShardedOptimizer.load_state`), so a run saved sharded resumes unsharded and the reverse.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from mindspore import Parameter, Tensor, ops

from hyperparallel.mpipe import ir
from .compat import load_optimizer_state, write_param
from .optim import Optimizer

SHARD = "shard."


def shard_elements(n: int, replicas: int) -> int:
    """Elements of one replica's share of a region of ``n`` elements (``ceil(n / replicas)``)."""
    return -(-n // replicas)


class Shard:
    """One region's share on this rank (see the module docstring)."""

    def __init__(self, region: str, params: List[Parameter], group: Tuple[int, ...], device: int, comm, cfg,
                 total_steps: int = 0):
        self.region, self.params, self.group, self.comm = region, list(params), tuple(group), comm
        self.sizes = [int(np.prod(p.shape)) if p.shape else 1 for p in self.params]
        self.n = sum(self.sizes)
        self.P = len(self.group)
        self.k = shard_elements(self.n, self.P)
        self.index = sorted(self.group).index(device)
        self.slice = Parameter(self._mine(self._flat(self.params)), name=SHARD + region)
        self.opt = Optimizer([self.slice], cfg, total_steps)

    def _flat(self, tensors) -> Tensor:
        flat = ops.concat([ops.stop_gradient(t).reshape(-1) for t in tensors])
        pad = self.P * self.k - self.n
        return ops.concat([flat, ops.zeros((pad,), flat.dtype)]) if pad else flat

    def _mine(self, flat: Tensor) -> Tensor:
        # a copy: a slice is a view, which MindSpore's in-place optimizer kernels refuse
        return flat[self.index * self.k:(self.index + 1) * self.k].copy()

    def gather(self, t: Tensor) -> Tensor:
        """The flat vector of N elements from every replica's slice ``t``."""
        parts = self.comm.all_gather(t, self.group)
        return ops.concat(list(parts))[:self.n]

    def update(self, grads: Dict[str, Tensor]) -> None:
        """Step this replica's slice from the reduced grads, gather every slice into the parameters."""
        # in place: after set_data, the optimizer's compiled update would still write the old buffer
        ops.assign(self.slice, self._mine(self._flat(self.params)))
        g = self._mine(self._flat([grads[p.name] if grads.get(p.name) is not None else ops.zeros_like(p)
                                   for p in self.params]))
        self.opt.step({self.slice.name: g})
        self._write(self.params, self.gather(ops.stop_gradient(self.slice) * 1))

    def _write(self, targets: List[Parameter], flat: Tensor) -> None:
        off = 0
        for p, n in zip(targets, self.sizes):
            write_param(p, flat[off:off + n])   # in place: compiled chunks keep reading the parameter's buffer
            off += n

    # -- the share's per-parameter state under the global names ------------------------------------
    def _slots(self) -> List[Tuple[str, str]]:
        """(slot, state name) of the share's per-element state, e.g. ("moment1", "moment1.shard.vision")."""
        per, _ = self.opt.state_groups()
        return [(name[:-len("." + self.slice.name)], name) for name in per.get(self.slice.name, [])]

    def state_shapes(self) -> Dict[str, "Shape"]:
        """``<slot>.<param>`` of every slot and parameter, with the parameter's shape (no data)."""
        return {f"{slot}.{p.name}": Shape(tuple(p.shape)) for slot, _ in self._slots() for p in self.params}

    def gathered_state(self) -> Dict[str, Tensor]:
        """Every replica's slots gathered into full-shape ``<slot>.<param>`` tensors (every replica calls this)."""
        state, out = self.opt.state(), {}
        for slot, name in self._slots():
            flat, off = self.gather(ops.stop_gradient(state[name]) * 1), 0
            for p, n in zip(self.params, self.sizes):
                out[f"{slot}.{p.name}"] = flat[off:off + n].reshape(p.shape).copy()
                off += n
        return out

    def load(self, values: Dict[str, object], glob: Dict[str, object]) -> None:
        """This replica's slice of full-shape ``<slot>.<param>`` values; the optimizer's globals from ``glob``."""
        _, globals_ = self.opt.state_groups()
        state = self.opt.state()
        for slot, name in self._slots():
            full = self._flat([_tensor(values[f"{slot}.{p.name}"]) for p in self.params])
            ops.assign(state[name], self._mine(full).astype(state[name].dtype))
        for n in globals_:
            if n in glob:
                ops.assign(state[n], _tensor(glob[n]).astype(state[n].dtype).reshape(state[n].shape))


class Shape:
    """A name's shape, without data (what the checkpoint loader checks before loading)."""

    def __init__(self, shape: Tuple[int, ...]):
        self.shape = shape


def _tensor(v) -> Tensor:
    return v if isinstance(v, Tensor) else Tensor(np.asarray(v))


class ShardedOptimizer:
    """The rank's optimizer when regions are sharded: :class:`~.optim.Optimizer` over the rest, one
    :class:`Shard` per sharded region (their update runs at the plan's ``ALLGATHER``). Same interface as
    :class:`~.optim.Optimizer` for the checkpoint saver and loader (global names, full shapes)."""

    def __init__(self, params: List[Parameter], shards: Dict[str, Shard], cfg, total_steps: int = 0):
        names = {p.name for s in shards.values() for p in s.params}
        self.main = Optimizer([p for p in params if p.name not in names], cfg, total_steps)
        self.shards = shards
        self.params = list(params)
        self.opt = self.main.opt

    def step(self, grads) -> None:
        """The rest's update, then every shard's update and gather (every replica calls this at the same point)."""
        self.main.step(grads)
        for _, s in sorted(self.shards.items()):
            s.update(grads)

    def lr(self, step: int) -> float:
        return self.main.lr(step)

    def state(self) -> Dict[str, object]:
        """The rest's state (Parameters) and the shards' under the global names (:class:`Shape` only)."""
        out = dict(self.main.state())
        for s in self.shards.values():
            out.update(s.state_shapes())
        return out

    def state_groups(self):
        per, glob = self.main.state_groups()
        per = {k: list(v) for k, v in per.items()}
        for s in self.shards.values():
            for n in s.state_shapes():
                per.setdefault(n.partition(".")[2], []).append(n)
        return per, glob

    def optimizers(self) -> List[Optimizer]:
        """Every optimizer of the rank (memory accounting)."""
        return [self.main] + [s.opt for s in self.shards.values()]

    def before_save(self) -> Dict[str, Tensor]:
        """The shards' state gathered under the global names, full shape (every rank calls this when saving)."""
        out = {}
        for _, s in sorted(self.shards.items()):
            out.update(s.gathered_state())
        return out

    def load_state(self, values: Dict[str, object]) -> None:
        """Optimizer state by global name: the rest's into its optimizer, the shards' into their slices."""
        mine = set(self.main.state())
        if self.main.opt is not None:   # the parameters themselves: written in place by the restore
            load_optimizer_state(self.main.opt, {n: v for n, v in values.items() if n in mine})
        glob = {n: values[n] for n in self.main.state_groups()[1] if n in values}
        for s in self.shards.values():
            s.load(values, glob)


def shards_of(plan: ir.Plan, interp, comm, cfg, total_steps: int = 0) -> Dict[str, Shard]:
    """The shards of this rank's program (``ALLGATHER weights`` regions), over their replica groups."""
    out = {}
    for a in interp.program:
        if a.kind == ir.ALLGATHER and a.tensor == ir.WEIGHTS and a.region not in out:
            out[a.region] = Shard(a.region, interp.region_params(a.region), a.group, comm.device, comm, cfg,
                                  total_steps)
    return out
