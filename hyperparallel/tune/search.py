"""Best-first search over a :class:`~.space.Space` with bound pruning.

1. Every base candidate gets its bounds (:mod:`.bound`). One whose memory bound exceeds the limit on
   some device is dropped without derivation.
2. The rest are taken in order of their time bound (best first, a heap). A candidate taken with only
   its cheap bound (:func:`~.bound.time_bound`) first gets its LLM-alone bound
   (:func:`~.bound.body_bound`, one derivation shared by every encoder option) and goes back in line;
   one taken with both is derived, checked and costed by the same
   chain as ``plan`` and ``simulate`` (:func:`~hyperparallel.recipe.checked_plan`,
   :func:`~hyperparallel.mpipe.cost.simulate`; next-step spill runs 3 steps and reports the last, as
   ``simulate`` does); one whose predicted peak exceeds the limit is dropped. Once ``top`` candidates
   are kept (one per family: the table shows each family's best split), a candidate whose bound
   exceeds the ``top``-th best family's step is not derived: it cannot enter the table, so the table
   is exact over the base space.
3. Refinement: the best ``refine`` families (everything but the layer split) move one layer at a time
   between neighbouring chunks, first improvement first, each move bounded and pruned the same way,
   at most ``refine_budget`` derivations per family.

Spellings that derive the same plan (the same chunks and per-device programs, e.g. ``zb_h1`` and
``interleaved_zb`` at V=1, or owners ``round_robin`` and ``min`` where they place alike) are one
candidate: the best-ranked spelling is kept, the others are listed as its ``same_plan`` names and
counted, so the table and ``--verify`` compare distinct plans, never a plan against itself.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..mpipe.cost import simulate
from ..errors import PlanError, SpecError
from ..recipe.recipe import checked_plan
from .bound import body_bound, memory_bound, time_bound
from .space import Candidate, Space


@dataclass
class Scored:
    cand: Candidate
    name: str
    step_ms: float
    bubble: float
    peaks_mb: Tuple[float, ...]
    fingerprint: str = ""                                 # the derived plan's (:func:`plan_fingerprint`)
    same_plan: List[str] = field(default_factory=list)    # other spellings that derived this very plan

    @property
    def peak_mb(self) -> float:
        return max(self.peaks_mb)

    @property
    def peak_device(self) -> int:
        return self.peaks_mb.index(self.peak_mb)


@dataclass
class Outcome:
    space: Space
    limit_mb: Optional[float]
    top: int
    ranked: List[Scored] = field(default_factory=list)   # every kept candidate, best first
    counts: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    lowest_peak: Optional[Scored] = None                 # the smallest predicted peak among the derived
    first_refusal: Optional[str] = None                  # the first derivation the algebra refused
    seconds: float = 0.0       # wall time of the search
    cpu_seconds: float = 0.0   # its CPU time (the wall time on a machine shared with other jobs is longer)

    @property
    def table(self) -> List[Scored]:
        """The ``top`` best candidates, one per family (its best layer split): rows that differ only
        in where one layer sits would fill the table with near-copies."""
        out, seen = [], set()
        for s in self.ranked:
            if s.cand.family not in seen:
                seen.add(s.cand.family)
                out.append(s)
        return out[: self.top]


def rank_key(space: Space, s: Scored) -> tuple:
    """Step time, then peak memory, then the fewest changes to the recipe, then the shortest spelling."""
    c = s.cand
    changes = ((c.M != space.M0) + (c.V != space.V0) + (c.split not in ("even", "recipe", "all"))
               + (c.T != space.recipe.tensor_parallel) + (c.recompute is not None))
    return (round(s.step_ms, 6), round(s.peak_mb, 3), changes, len(s.name), s.name, c.M, c.V, c.layers)


#: schedule-entry keys that only say how the programs were made (their effect is in the programs)
_HOW_KEYS = ("order", "owners")


def plan_fingerprint(plan) -> str:
    """What the runtime executes of a plan: devices, micro-batches, chunks, per-device programs and the
    schedule entries' other options (backward, spill, optimizer, ...), not the spelling (``meta``)."""
    j = plan.to_json()
    j.pop("meta", None)
    j["schedule"] = [{k: v for k, v in e.items() if k not in _HOW_KEYS} for e in j.get("schedule", [])]
    return hashlib.sha1(json.dumps(j, sort_keys=True).encode()).hexdigest()


def evaluate(space: Space, c: Candidate) -> Scored:
    """Derive, check and cost one candidate (SpecError / PlanError when the algebra refuses it)."""
    recipe = space.recipe_for(c)
    plan = checked_plan(recipe, space.schedule(c))
    rep = simulate(plan, recipe.profile, steps=3 if c.spill else 1)
    return Scored(c, plan.meta["schedule_name"], rep.step_ms, rep.bubble_ratio,
                  tuple(d.peak_memory_mb for d in rep.devices), plan_fingerprint(plan))


class _Run:
    def __init__(self, space: Space, limit_mb: Optional[float], top: int, prune: bool):
        self.space, self.limit, self.top, self.prune = space, limit_mb, top, prune
        self.out = Outcome(space, limit_mb, top)
        self.kept: List[Scored] = []
        self.plans: Dict[str, Scored] = {}   # fingerprint -> the kept spelling of that plan
        self._threshold: Optional[float] = None   # cached; None after kept changes
        self.seen = set()
        self.bodies: Dict[tuple, float] = {}   # body_bound's cache

    def threshold(self) -> float:
        """The ``top``-th best step over families of the kept, distinct plans (the table holds one row
        per family)."""
        if not self.prune:
            return float("inf")
        if self._threshold is None:
            best: Dict[tuple, float] = {}
            for s in self.kept:
                best[s.cand.family] = min(best.get(s.cand.family, float("inf")), s.step_ms)
            self._threshold = float("inf") if len(best) < self.top else sorted(best.values())[self.top - 1]
        return self._threshold

    def admit(self, c: Candidate) -> Optional[float]:
        """The candidate's time bound, or None when its memory bound already rules it out."""
        self.out.counts["searched"] += 1
        if self.limit is not None and self.prune and max(memory_bound(self.space, c)) > self.limit:
            self.out.counts["memory_bound"] += 1
            return None
        return time_bound(self.space, c) if self.prune else 0.0

    def beaten(self, c: Candidate, limit: float) -> bool:
        """Does the LLM-alone bound already exceed ``limit``? (only asked once the cheap bound has not)"""
        if not self.prune or c.spill or limit == float("inf"):
            return False
        if body_bound(self.space, c, self.bodies) > limit:
            self.out.counts["time_bound"] += 1
            return True
        return False

    def derive(self, c: Candidate) -> Optional[Scored]:
        self.out.counts["derived"] += 1
        try:
            s = evaluate(self.space, c)
        except (SpecError, PlanError) as e:
            self.out.refused[str(e).split(":", 1)[0]] += 1
            if self.out.first_refusal is None:
                self.out.first_refusal = str(e).splitlines()[0]
            return None
        lp = self.out.lowest_peak
        if lp is None or s.peak_mb < lp.peak_mb:
            self.out.lowest_peak = s
        if self.limit is not None and s.peak_mb > self.limit:
            self.out.counts["memory"] += 1
            return None
        self._threshold = None
        twin = self.plans.get(s.fingerprint)
        if twin is not None:   # another spelling of a plan already kept: one candidate, the better-ranked name
            self.out.counts["same_plan"] += 1
            keep, other = sorted((twin, s), key=lambda x: rank_key(self.space, x))
            keep.same_plan = sorted(set(twin.same_plan + s.same_plan + [other.name]) - {keep.name})
            other.same_plan = []
            if keep is s:
                self.kept[self.kept.index(twin)] = s
                self.plans[s.fingerprint] = s
            return s
        self.plans[s.fingerprint] = s
        self.kept.append(s)
        return s

    def base(self) -> None:
        """Best-first by bound: a candidate taken with only its cheap bound gets its LLM-alone bound
        (:func:`~.bound.body_bound`) and goes back in line; one taken with both is derived."""
        heap = []
        for c in self.space.candidates():
            self.seen.add((c.family, c.layers))
            lb = self.admit(c)
            if lb is not None:
                heap.append((lb, len(heap), not self.prune or c.spill, c))
        heapq.heapify(heap)
        while heap:
            lb, i, tight, c = heapq.heappop(heap)
            if lb > self.threshold():
                self.out.counts["time_bound"] += len(heap) + 1
                break
            if not tight:
                heapq.heappush(heap, (max(lb, body_bound(self.space, c, self.bodies)), i, True, c))
                continue
            self.derive(c)

    def refine(self, families: int, budget: int) -> None:
        best: Dict[tuple, Scored] = {}
        for s in sorted(self.kept, key=lambda s: rank_key(self.space, s)):
            best.setdefault(s.cand.family, s)
        for fam in list(best)[:families]:
            cur, spent = best[fam], 0
            while spent < budget:
                moves = []
                for c in self.neighbours(cur.cand):
                    lb = self.admit(c)
                    if lb is not None:
                        moves.append((lb, c))
                better = None
                for k, (lb, c) in enumerate(sorted(moves, key=lambda x: (x[0], x[1].layers))):
                    if lb > min(self.threshold(), cur.step_ms) or spent >= budget:
                        self.out.counts["time_bound"] += len(moves) - k
                        break
                    if self.beaten(c, min(self.threshold(), cur.step_ms)):
                        continue
                    spent += 1
                    s = self.derive(c)
                    if s is not None and s.step_ms < cur.step_ms - 1e-9:
                        better = s
                        self.out.counts["time_bound"] += len(moves) - k - 1   # first improvement: the rest unsearched
                        break
                if better is None:
                    break
                cur = better

    def neighbours(self, c: Candidate) -> List[Candidate]:
        out = []
        n = len(c.layers)
        for i in range(n):
            for j in (i - 1, i + 1):
                if 0 <= j < n and c.layers[i] > 1:
                    layers = list(c.layers)
                    layers[i] -= 1
                    layers[j] += 1
                    nc = Candidate(c.order, c.V, c.M, c.encoder, tuple(layers), "moved", c.T, c.recompute)
                    key = (nc.family, nc.layers)
                    if key not in self.seen:
                        self.seen.add(key)
                        out.append(nc)
        return out


def lowest_peak(space: Space) -> Optional[Scored]:
    """The derived candidate with the smallest predicted peak memory (its largest device), taking
    candidates by their memory bound and stopping once the bound exceeds the smallest peak found."""
    queue = sorted(((max(memory_bound(space, c)), i, c) for i, c in enumerate(space.candidates())),
                   key=lambda x: (x[0], x[1]))
    best: Optional[Scored] = None
    for mb, _, c in queue:
        if best is not None and mb > best.peak_mb:
            break
        try:
            s = evaluate(space, c)
        except (SpecError, PlanError):
            continue
        if best is None or s.peak_mb < best.peak_mb:
            best = s
    return best


def search(space: Space, limit_mb: Optional[float] = None, top: int = 5, prune: bool = True,
           refine: int = 2, refine_budget: int = 12) -> Outcome:
    """Search ``space``; ``prune=False`` derives every base candidate (the exhaustive reference)."""
    t0, c0 = time.perf_counter(), time.process_time()
    run = _Run(space, limit_mb, max(1, top), prune)
    run.base()
    if refine and run.kept:
        run.refine(refine, refine_budget)
    out = run.out
    out.ranked = sorted(run.kept, key=lambda s: rank_key(space, s))
    out.counts["kept"] = len(run.kept)
    out.counts["body_bounds"] = len(run.bodies)
    out.counts["refused"] = sum(out.refused.values())
    out.seconds = time.perf_counter() - t0
    out.cpu_seconds = time.process_time() - c0
    return out
