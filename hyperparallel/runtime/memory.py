"""Per-rank memory measured on a real rank (issue 23): what the cost model predicts, counted where it lives.

Per step, a rank records (:func:`rank_memory`, one JSON object; the keys are in docs/training.md):

* ``peak_held`` (per region) and ``peak_held_total``: the peak number of forwards it holds for a later
  backward on this rank: a forward that records a tape (F, or R of a central backward) is held from its
  action to its last backward task (W, or BW); the interpreter counts them as it runs
  (:class:`HeldForwards`). A forward without a backward here (frozen, next-step work) is not held.
* ``peak_held_bytes``: the peak bytes of the boundary tensors of the held forwards (each one's input and
  output; what its tape keeps inside the chunk is not visible from here, so not counted), and of the
  inputs that recomputed chunks' forwards keep for their R (not held forwards: no tape);
* ``params_bytes``, ``grads_bytes``, ``optimizer_bytes``: the bytes of the parameters of every chunk the
  rank holds, of the gradients it hands the optimizer, and of the optimizer's per-parameter state
  (``moment1``/``moment2`` of Adam, ``accum``/``stat`` of SGD); ``optimizer_global_bytes``: the
  optimizer's few global scalars (``beta1_power``, ``global_step``, ...), which the cost model does not
  count;
* ``peak_grad_bytes``: the peak bytes of the gradients the rank holds between two actions of its program
  (whole gradients as they accumulate; under ZeRO-2 a region's are replaced by this rank's shares at the
  plan's reduce-scatter of the region).
"""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

import numpy as np


def nbytes(x) -> int:
    """Bytes of a tensor (or of the tensors of a tuple/list/dict; 0 for anything else)."""
    if x is None:
        return 0
    if isinstance(x, (tuple, list)):
        return sum(nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    n = getattr(x, "nbytes", None)   # MindSpore Tensors and Parameters, numpy arrays
    return int(n) if isinstance(n, (int, np.integer)) else 0


class HeldForwards:
    """Counts the forwards this rank holds for a later backward, per region, and their peak per step."""

    def __init__(self, regions: Iterable[str]):
        self.regions = list(regions)
        self.live: Dict[Tuple, int] = {}          # key -> bytes of its boundary tensors
        self.kept: Dict[Tuple, int] = {}          # key -> bytes of a recomputed forward's kept input
        self.count = {r: 0 for r in self.regions}
        self.bytes = 0
        self.new_step()

    def new_step(self) -> None:
        """Peaks restart from what is held now (nothing, between steps)."""
        self.peak = dict(self.count)
        self.peak_total = sum(self.count.values())
        self.peak_bytes = self.bytes

    def keep(self, key: Tuple, size: int) -> None:
        """A recomputed chunk's forward keeps its input (``size`` bytes) until its R: bytes, not a held forward."""
        self.kept[key] = size
        self.bytes += size
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def hold(self, key: Tuple, size: int) -> None:
        self.bytes -= self.kept.pop(key, 0)   # an R: the kept input is now part of the held forward
        self.live[key] = size
        self.count[key[0]] += 1
        self.bytes += size
        if self.count[key[0]] > self.peak[key[0]]:
            self.peak[key[0]] = self.count[key[0]]
        total = len(self.live)
        if total > self.peak_total:
            self.peak_total = total
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def release(self, key: Tuple) -> None:
        size = self.live.pop(key, None)
        if size is not None:
            self.count[key[0]] -= 1
            self.bytes -= size

    def record(self) -> dict:
        return {"peak_held": dict(self.peak), "peak_held_total": self.peak_total, "peak_held_bytes": self.peak_bytes}


def static_bytes(params, grads: Dict[str, object], optimizer) -> dict:
    """Bytes of the rank's parameters, the gradients it hands the optimizer, the optimizer's state (of
    every optimizer it runs: a sharded region's share has its own, :mod:`.sharded`)."""
    opt_bytes = glob_bytes = 0
    for opt in (optimizer.optimizers() if hasattr(optimizer, "optimizers") else [optimizer]):
        per, glob = opt.state_groups()
        state = opt.state()
        opt_bytes += sum(nbytes(state[n]) for names in per.values() for n in names)
        glob_bytes += sum(nbytes(state[n]) for n in glob)
    return {"params_bytes": sum(nbytes(p) for p in params),
            "grads_bytes": sum(nbytes(g) for g in grads.values()),
            "optimizer_bytes": opt_bytes, "optimizer_global_bytes": glob_bytes}


def rank_memory(rt, grads: Dict[str, object]) -> dict:
    """This rank's memory record of the step just run on rank runtime ``rt`` (``grads``: the step's)."""
    out = {"rank": rt.comm.rank, "device": rt.comm.device, "dp_index": rt.comm.dp_index}
    out.update(rt.interp.held.record())
    out["peak_grad_bytes"] = rt.interp.peak_grad_bytes
    out.update(static_bytes(rt.parameters().values(), grads, rt.optimizer))
    return out
