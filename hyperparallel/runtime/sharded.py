"""Sharded optimizer state: ZeRO over the data-parallel replicas (issue 37) and ``transpose(optimizer=sharded)``
over a replicated encoder's pipeline replicas (issue 23 part 4), one code.

A **shard** is one region's parameters on this rank, held identically by every member of a group of
replicas (the data-parallel group of ZeRO, ``ALLGATHER weights`` over ``dp``; or the pipeline devices of a
transposed encoder, ``ALLGATHER weights`` over their tuple). Its parameters are split into the run's
weight-decay groups (:func:`~.optim.decay_groups`: MindFormers' grouping, no decay for biases and 1-D
parameters, or one group for the ``train:`` section), and each group's parameters, in one order on every
replica, are laid end to end in a flat vector of N elements padded to ``P x k`` (``k = ceil(N / P)``, P
members): a :class:`FlatShare`. Member i (its index in the group) keeps the slice ``[i k, (i + 1) k)`` of
every group as one flat Parameter (``shard.<label>[.<group>]``) and one optimizer over those slices, each in
its group's weight decay (:class:`~.optim.Optimizer`): Adam's or AdamW's moments are k elements, not N, and
weight decay applies where it would unsharded (every rule here is element-wise).

:meth:`Shard.update` takes the slice of the current parameters and of the reduced grads, steps the slices,
all-gathers the updated slices from every member and writes them into every parameter: every replica leaves
the step with the parameters of an unsharded run. The update needs the step's gradients as the optimizer
gets them (clipped by the global norm, known only after the program), so it runs in the rank's optimizer
step (:meth:`ShardedOptimizer.step`), right after the program and at the same point on every member; the
plan's ``ALLGATHER`` marks that end of the step for the checker and the cost model (the interpreter does
nothing there). ZeRO-2 (the plan's ``REDUCESCATTER wgrad dp``, per region after its last weight-gradient task
on the device where the derivation places it so, else at the step's end): the interpreter hands that region's
gradients to :meth:`ShardedOptimizer.scatter`, which reduce-scatters each of its flat groups over the
data-parallel group and keeps only this rank's slice (the full gradients are dropped there); the global norm
then sums each slice's counted part (:meth:`ShardedOptimizer.share_square`).

Checkpoints keep the global names: :class:`ShardedOptimizer` names in ``state()`` a full-shape
``<slot>.<param>`` entry for every sharded parameter's state (a shape only: nothing of full size is kept
between saves), gathers those from the members when a checkpoint is saved (:meth:`ShardedOptimizer.before_save`)
and loads such names into its slices (:meth:`ShardedOptimizer.load_state`), so a run saved sharded resumes
unsharded and the reverse.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from mindspore import Parameter, Tensor, ops

from hyperparallel.mpipe import ir
from hyperparallel.mpipe.cost import shard_elements   # the cost model's share size is this one
from .compat import load_optimizer_state, write_param
from .optim import Optimizer, decay_groups

SHARD = "shard."


class FlatShare:
    """One weight-decay group of a shard: its parameters as one padded flat vector, this member's slice kept."""

    def __init__(self, name: str, params: List[Parameter], members: int, index: int):
        self.params = list(params)
        self.sizes = [int(np.prod(p.shape)) if p.shape else 1 for p in self.params]
        self.n = sum(self.sizes)
        self.P, self.index = members, index
        self.k = shard_elements(self.n, self.P)
        self.param = Parameter(self.mine(self.flat(self.params)), name=name)

    def flat(self, tensors) -> Tensor:
        flat = ops.concat([ops.stop_gradient(t).reshape(-1) for t in tensors])
        pad = self.P * self.k - self.n
        return ops.concat([flat, ops.zeros((pad,), flat.dtype)]) if pad else flat

    def mine(self, flat: Tensor) -> Tensor:
        # a copy: a slice is a view, which MindSpore's in-place optimizer kernels refuse
        return flat[self.index * self.k:(self.index + 1) * self.k].copy()

    def grads_flat(self, grads: Dict[str, Tensor]) -> Tensor:
        return self.flat([grads[p.name] if grads.get(p.name) is not None else ops.zeros_like(p) for p in self.params])

    def split(self, flat: Tensor) -> Dict[str, Tensor]:
        """{parameter name: its part of the flat N (or padded) elements, in the parameter's shape}."""
        out, off = {}, 0
        for p, n in zip(self.params, self.sizes):
            out[p.name] = flat[off:off + n].reshape(p.shape).copy()
            off += n
        return out

    def segments(self, names: set) -> List[Tuple[int, int]]:
        """The ranges of this member's slice (slice coordinates) holding elements of the parameters ``names``."""
        lo_mine, hi_mine = self.index * self.k, (self.index + 1) * self.k
        out, off = [], 0
        for p, n in zip(self.params, self.sizes):
            lo, hi = max(off, lo_mine), min(off + n, hi_mine)
            if p.name in names and lo < hi:
                out.append((lo - lo_mine, hi - lo_mine))
            off += n
        return out


class Shard:
    """One region's share on this rank (see the module docstring): a :class:`FlatShare` per weight-decay group
    of ``params``, one optimizer over their slices. ``group``: the plan's group (``"dp"`` or pipeline devices)."""

    def __init__(self, label: str, params: List[Parameter], group, comm, cfg, total_steps: int = 0):
        self.label, self.group, self.comm = label, group, comm
        ranks = comm.ranks_of(group)
        self.P, self.index = len(ranks), ranks.index(comm.rank)
        groups = [(wd, ps) for wd, ps in decay_groups(list(params), cfg) if ps]
        one = len(groups) == 1
        self.shares = [FlatShare(SHARD + label + ("" if one else f".{i}"), ps, self.P, self.index)
                       for i, (_, ps) in enumerate(groups)]
        self.params = [p for s in self.shares for p in s.params]
        self.opt = Optimizer([s.param for s in self.shares], cfg, total_steps,
                             decays=None if groups[0][0] is None else [wd for wd, _ in groups])

    def gather(self, share: FlatShare, t: Tensor) -> Tensor:
        """The flat vector of N elements from every member's slice ``t`` of ``share``."""
        parts = self.comm.all_gather(t, self.group)
        return ops.concat(list(parts))[:share.n]

    def scatter(self, grads: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """ZeRO-2: {share name: this member's slice of the group's sum of ``grads``} (every member calls this)."""
        return {s.param.name: self.comm.reduce_scatter(s.grads_flat(grads), self.group) for s in self.shares}

    def update(self, grads: Dict[str, Tensor]) -> None:
        """Step this member's slices from the reduced grads (whole, or already this member's slices under the
        share names), gather every slice into the parameters."""
        g = {}
        for s in self.shares:
            # in place: after set_data, the optimizer's compiled update would still write the old buffer
            ops.assign(s.param, s.mine(s.flat(s.params)))
            g[s.param.name] = grads[s.param.name] if s.param.name in grads else s.mine(s.grads_flat(grads))
        self.opt.step(g)
        for s in self.shares:
            flat = self.gather(s, ops.stop_gradient(s.param) * 1)
            for p, v in zip(s.params, s.split(flat).values()):
                write_param(p, v)   # in place: compiled chunks keep reading the parameter's buffer

    def full_grads(self, grads: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The whole reduced gradient of every parameter from every member's slices (every member calls this)."""
        out = {}
        for s in self.shares:
            out.update(s.split(self.gather(s, grads[s.param.name])))
        return out

    # -- the share's per-parameter state under the global names ------------------------------------
    def _slots(self, share: FlatShare) -> List[Tuple[str, str]]:
        """(slot, state name) of a share's per-element state, e.g. ("moment1", "moment1.shard.vision")."""
        per, _ = self.opt.state_groups()
        return [(name[:-len("." + share.param.name)], name) for name in per.get(share.param.name, [])]

    def state_shapes(self) -> Dict[str, "Shape"]:
        """``<slot>.<param>`` of every slot and parameter, with the parameter's shape (no data)."""
        return {f"{slot}.{p.name}": Shape(tuple(p.shape)) for s in self.shares for slot, _ in self._slots(s)
                for p in s.params}

    def gathered_state(self) -> Dict[str, Tensor]:
        """Every member's slots gathered into full-shape ``<slot>.<param>`` tensors (every member calls this)."""
        state, out = self.opt.state(), {}
        for s in self.shares:
            for slot, name in self._slots(s):
                for pname, v in s.split(self.gather(s, ops.stop_gradient(state[name]) * 1)).items():
                    out[f"{slot}.{pname}"] = v
        return out

    def load(self, values: Dict[str, object], glob: Dict[str, object]) -> None:
        """This member's slices of full-shape ``<slot>.<param>`` values; the optimizer's globals from ``glob``."""
        _, globals_ = self.opt.state_groups()
        state = self.opt.state()
        for s in self.shares:
            for slot, name in self._slots(s):
                full = s.flat([_tensor(values[f"{slot}.{p.name}"]) for p in s.params])
                ops.assign(state[name], s.mine(full).astype(state[name].dtype))
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
    :class:`~.optim.Optimizer` for the checkpoint saver and loader (global names, full shapes); under ZeRO
    every trained parameter is in a shard, and the optimizer's global scalars (``global_step``, ``beta1_power``,
    ...) are the first shard's (every shard's are equal: they step together)."""

    def __init__(self, params: List[Parameter], shards: Dict[str, Shard], cfg, total_steps: int = 0):
        names = {p.name for s in shards.values() for p in s.params}
        self.main = Optimizer([p for p in params if p.name not in names], cfg, total_steps)
        self.shards = shards
        self.params = list(params)
        self.opt = self.main.opt
        # the optimizer whose global scalars the checkpoint carries: the rest's, or the first shard's
        self.lead = self.main if self.main.opt is not None else self.shards[sorted(self.shards)[0]].opt

    def step(self, grads) -> None:
        """The rest's update, then every shard's update and gather (every member calls this at the same point)."""
        self.main.step(grads)
        for _, s in sorted(self.shards.items()):
            s.update(grads)

    def scatter(self, grads: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """ZeRO-2's reduce-scatter of the gradients ``grads`` (a region's, after its last weight-gradient task
        here, or every one not scattered yet): {share name: this rank's slice} of every shard holding one
        of them (each member calls this with the same names)."""
        out = {}
        for _, s in sorted(self.shards.items()):
            if any(p.name in grads for p in s.params):
                out.update(s.scatter(grads))
        return out

    def share_square(self, grads: Dict[str, Tensor], counted: set) -> float:
        """Square sum of the elements of the counted parameters (``counted``: names) in the slices held in
        ``grads`` (ZeRO-2; 0 where none): each member sums its own slice, the step's all-reduce adds them."""
        parts = []
        for _, s in sorted(self.shards.items()):
            for share in s.shares:
                g = grads.get(share.param.name)
                parts += [g[lo:hi] for lo, hi in (share.segments(counted) if g is not None else ())]
        return float(ops.sum(ops.square(ops.concat(parts))).asnumpy()) if parts else 0.0

    def full_grads(self, grads: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """``grads`` with every held slice replaced by the whole gradients (ZeRO-2; a collective, for dumps)."""
        out = {n: g for n, g in grads.items() if not n.startswith(SHARD)}
        for _, s in sorted(self.shards.items()):
            if any(share.param.name in grads for share in s.shares):
                out.update(s.full_grads(grads))
        return out

    def lr(self, step: int) -> float:
        return self.lead.lr(step)

    def _lead_globals(self) -> List[str]:
        return [] if self.lead is self.main else self.lead.state_groups()[1]

    def state(self) -> Dict[str, object]:
        """The rest's state (Parameters) and the shards' under the global names (:class:`Shape` only)."""
        out = dict(self.main.state())
        for s in self.shards.values():
            out.update(s.state_shapes())
        lead = self.lead.state()
        out.update({n: lead[n] for n in self._lead_globals()})
        return out

    def state_groups(self):
        per, glob = self.main.state_groups()
        per = {k: list(v) for k, v in per.items()}
        for s in self.shards.values():
            for n in s.state_shapes():
                per.setdefault(n.partition(".")[2], []).append(n)
        return per, list(glob) + self._lead_globals()

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
        glob = {n: values[n] for n in self.state_groups()[1] if n in values}
        for s in self.shards.values():
            s.load(values, glob)


def shards_of(plan: ir.Plan, interp, comm, cfg, total_steps: int = 0) -> Dict[str, Shard]:
    """The shards of this rank's program: each ``ALLGATHER weights`` region over its pipeline replicas
    (``transpose(optimizer=sharded)``); with ``ALLGATHER weights`` over ``dp`` (ZeRO) every region this rank
    updates, over its data-parallel group (label ``zero.<region>``)."""
    out = {}
    for a in interp.program:
        if a.kind != ir.ALLGATHER or a.tensor != ir.WEIGHTS:
            continue
        if a.group == ir.DP_GROUP:
            updated = {p.name for p in interp.updated}
            for region in interp.regions:
                names = {p.name for p in interp.region_params(region)} & updated
                params = [p for p in interp.updated if p.name in names]
                if params and f"zero.{region}" not in out:
                    out[f"zero.{region}"] = Shard(f"zero.{region}", params, a.group, comm, cfg, total_steps)
        elif a.region not in out:
            out[a.region] = Shard(a.region, interp.region_params(a.region), a.group, comm, cfg, total_steps)
    return out
