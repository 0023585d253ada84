"""Per-step sample assignment (``data.balance: encoder``): the samples of a step's global batch are
spread over its micro-batches so that the encoder work of every owner rank is as even as possible.

Transpose fixes the owner of micro-batch ``m`` (the rank running its encoder forward) in the plan, but
the encoder's work per micro-batch varies with the data (no image in one, five in the next, patch
counts differing with dynamic resolution). Before a step, :func:`assign` takes the step's samples
(their encoder work: patches, from the index) and the owner of each global micro-batch and returns,
per micro-batch, which of the step's samples it holds:

1. samples by decreasing work (ties: position in the step) go, one by one, to the owner whose work
   per owned micro-batch would be least after taking it, among owners with a free place (an owner of
   ``k`` micro-batches has ``k x B`` places): owners get even work per micro-batch they own, so a
   policy that gives an owner fewer micro-batches (``owners=balanced``) keeps giving it less work
   (ties go to the later owner, which has more slack);
2. within an owner, the same rule spreads its samples over its micro-batches, ``B`` each;
3. each micro-batch lists its samples in step order.

Every micro-batch keeps its ``B`` samples, and every sample is padded to the data's ``seq_len`` on its
own, so any sample fits any micro-batch. The result is a pure function of the work list and the
owners: every rank computes the same assignment without communication, and a resumed run (the
checkpoint's data position gives the same samples per step) the same one. With
``train.loss_normalization: tokens`` the step's loss and gradients do not depend on the grouping, so
a balanced run trains exactly as an unbalanced one.
"""
from __future__ import annotations

from typing import Dict, Hashable, List, Sequence

MODES = ("none", "encoder")


def _spread(items: Sequence[int], work: Sequence[float], bins: Sequence[Hashable], places: Dict, weight: Dict
            ) -> Dict[Hashable, List[int]]:
    """``items`` (sorted by decreasing work) into ``bins`` with ``places[b]`` free places each: each to
    the bin whose load per ``weight[b]`` is least after taking it (ties: the later bin, as
    ``transpose(owners=balanced)`` breaks them: a later device has more slack in every pipelined order)."""
    load = {b: 0.0 for b in bins}
    free = dict(places)
    out: Dict[Hashable, List[int]] = {b: [] for b in bins}
    order = {b: i for i, b in enumerate(bins)}
    for i in items:
        b = min((b for b in bins if free[b] > 0), key=lambda b: ((load[b] + work[i]) / weight[b], -order[b]))
        out[b].append(i)
        load[b] += work[i]
        free[b] -= 1
    return out


def assign(work: Sequence[float], batch: int, owners: Sequence[Hashable]) -> List[List[int]]:
    """Sample indices (into ``work``, the step's samples in position order) of each global micro-batch
    ``g``, whose encoder forward runs on ``owners[g]``; ``batch`` samples per micro-batch."""
    G = len(owners)
    if len(work) != G * batch:
        raise ValueError(f"{len(work)} samples for {G} micro-batches of {batch}")
    keys = list(dict.fromkeys(owners))   # in order of first appearance
    count = {k: sum(1 for o in owners if o == k) for k in keys}
    order = sorted(range(len(work)), key=lambda i: (-work[i], i))
    per_owner = _spread(order, work, keys, {k: count[k] * batch for k in keys}, count)
    out: List[List[int]] = [[] for _ in range(G)]
    for k in keys:
        micros = [g for g in range(G) if owners[g] == k]
        mine = sorted(per_owner[k], key=lambda i: (-work[i], i))
        got = _spread(mine, work, micros, {g: batch for g in micros}, {g: 1 for g in micros})
        for g in micros:
            out[g] = sorted(got[g])
    return out


def identity(G: int, batch: int) -> List[List[int]]:
    """The unbalanced grouping: micro-batch ``g`` holds samples ``g*B .. g*B + B - 1`` of the step."""
    return [list(range(g * batch, (g + 1) * batch)) for g in range(G)]


def owner_work(work: Sequence[float], groups: List[List[int]], owners: Sequence[Hashable],
               floor: float = 0.0) -> Dict[Hashable, float]:
    """Encoder work per owner of a grouping; a micro-batch counts at least ``floor`` (its filler image)."""
    out: Dict[Hashable, float] = {}
    for g, idx in enumerate(groups):
        out[owners[g]] = out.get(owners[g], 0.0) + max(floor, sum(work[i] for i in idx))
    return out


def check_plan(plan, mode: str) -> None:
    """``data.balance: encoder`` needs encoder owners in the plan (a ``transpose`` region): SpecError
    naming the key otherwise (checked before launch)."""
    from ..errors import SpecError
    from ..mpipe.owners import encoder_owners
    if mode == "encoder" and encoder_owners(plan) is None:
        name = plan.meta.get("schedule_name", "this schedule")
        raise SpecError("data.balance", f"encoder needs a schedule whose encoder forwards have owners (transpose); "
                                        f"{name} runs them where the plan puts the encoder's chunks: give data.balance: "
                                        "none")


def owner_ranks(plan) -> List[int]:
    """Owner rank (stage-major: ``device * D + dp_index``) of every global micro-batch ``dp_index * M + m``."""
    region, owners = _owners(plan)
    D = max(1, plan.data_parallel)
    return [owners[m] * D + i for i in range(D) for m in range(plan.num_micro)]


def _owners(plan):
    from ..mpipe.owners import encoder_owners
    got = encoder_owners(plan)
    if got is None:
        check_plan(plan, "encoder")
    return got


def owner_ms_per_patch(plan, profile, mean_patches: float, batch: int) -> float:
    """Predicted encoder time per patch on its owner: the profile's encoder tasks of one micro-batch on
    its owner (forward, and the backward where the owner runs it) over the data's mean patches per
    micro-batch (``mean_patches`` per sample x ``batch``)."""
    from ..mpipe.cost import Durations
    region, owners = _owners(plan)
    dur = Durations(plan, profile)
    ms = sum(dur.compute(a) - profile.action_overhead_ms for a in plan.programs.get(owners[0], [])
             if a.region == region and a.micro == 0 and a.kind in ("F", "B", "W", "BW"))
    per_micro = mean_patches * batch
    return ms / per_micro if per_micro > 0 else 0.0


class StepRecord:
    """The ``encoder_work`` entry of a ``metrics.jsonl`` line when balancing is on: per owner rank the
    predicted encoder work of the step, balanced and as the position order would have grouped it, in
    patches and (with a profile) milliseconds."""

    def __init__(self, source, plan, profile=None):
        self.source = source
        B = source.cfg.micro_batch_size
        self.ms = owner_ms_per_patch(plan, profile, source.mean_patches(), B) if profile is not None else None
        self.identity = identity(len(source.owners), B)
        # milliseconds: the encoder profile's fixed share per micro-batch, the rest per patch
        share = profile.region(_owners(plan)[0]).fixed_share if profile is not None else 0.0
        self.fixed_ms = share * (self.ms or 0.0) * source.mean_patches() * B
        self.patch_ms = (1.0 - share) * (self.ms or 0.0)
        self.micros = {k: sum(1 for o in source.owners if o == k) for k in source.owners}

    def __call__(self, step: int) -> dict:
        src = self.source
        work = src.encoder_work(step)
        out = {}
        for name, groups in (("", src.groups(step)), ("_unbalanced", self.identity)):
            per = owner_work(work, groups, src.owners, src.filler_patches)
            out["patches" + name] = {str(k): int(v) for k, v in sorted(per.items())}
            if self.ms is not None:
                out["ms" + name] = {str(k): round(self.micros[k] * self.fixed_ms + v * self.patch_ms, 3)
                                    for k, v in sorted(per.items())}
        return out
