"""Owner policies of ``transpose``: which device runs the encoder forward of micro-batch m."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..errors import SpecError


def round_robin(P: int, M: int, **_) -> List[int]:
    return [m % P for m in range(M)]


def minimal(P: int, M: int, **_) -> List[int]:
    """Micro-batch m on device m for m < P, the rest on device 0."""
    return [m if m < P else 0 for m in range(M)]


def _counts(P: int, M: int, cost) -> List[int]:
    """Greedy: each next micro-batch goes where the objective ``cost(counts)`` grows least.

    Ties go to the device with the higher index (more slack in every pipelined order).
    """
    counts = [0] * P
    for _ in range(M):
        best, best_key = 0, None
        for d in range(P):
            counts[d] += 1
            key = (cost(counts, d), -d)
            counts[d] -= 1
            if best_key is None or key < best_key:
                best, best_key = d, key
        counts[best] += 1
    return counts


def balanced(P: int, M: int, encoder_ms: float = 0.0, encoder_bwd_ms: float = 0.0,
             start_slack: Optional[Sequence[float]] = None, end_slack: Optional[Sequence[float]] = None,
             gap_slots: Optional[Sequence[int]] = None, spill: bool = False, **_) -> List[int]:
    """Owner counts chosen once from the profile so that encoder work fits each device's idle time.

    Without spill, owner d runs ``n_d`` encoder forwards (``E`` each) in its prefix, before its
    first body task, which the body alone would start ``start_slack[d]`` after device 0
    (``d * f`` in 1F1B; device 0 has the least slack, the last device the most). The forward wave
    reaches the last device ``max_d(n_d * E - start_slack[d])`` late, so the counts minimise that
    overshoot; with an owner backward (``Eb`` per micro-batch, run in the cooldown) the overshoot
    ``max_d(n_d * Eb - end_slack[d])`` is added. With next-step spill, device d has
    ``gap_slots[d]`` free places in the idle gaps of its body order and ``end_slack[d]`` of
    cooldown idle; the counts minimise the largest overshoot past that.
    Micro-batches are then handed out in need order: device 0 consumes m in ascending order,
    so the earliest micro-batches go to the owners that finish a forward soonest.
    """
    if encoder_ms <= 0 or P == 1:
        return round_robin(P, M)
    start = list(start_slack) if start_slack is not None else [0.0] * P
    end = list(end_slack) if end_slack is not None else [0.0] * P
    E, Eb = encoder_ms, encoder_bwd_ms
    if spill:
        slots = list(gap_slots) if gap_slots is not None else [0] * P

        def over(d: int, n: int) -> float:
            return max(0.0, (n - slots[d]) * E - end[d])

        def cost(counts, d):
            worst = max(over(x, counts[x]) for x in range(P))
            room = (slots[d] - counts[d]) * E + end[d]
            return (worst, -room)
    else:
        def cost(counts, d):
            pre = max(counts[x] * E - start[x] for x in range(P))
            post = max(counts[x] * Eb - end[x] for x in range(P)) if Eb > 0 else 0.0
            return (max(pre, 0.0) + max(post, 0.0), counts[d] * E - start[d])
    counts = _counts(P, M, cost)
    owners: List[int] = []
    done = [0] * P
    for _ in range(M):
        # next micro-batch goes to the owner whose next forward finishes earliest
        d = min((d for d in range(P) if done[d] < counts[d]), key=lambda d: ((done[d] + 1) * E, -d))
        done[d] += 1
        owners.append(d)
    return owners


POLICIES = {"round_robin": round_robin, "min": minimal, "balanced": balanced}


def owner_map(policy: str, P: int, M: int, **profile_terms) -> List[int]:
    """Owner device of each micro-batch; ``balanced`` reads the profile terms (see :func:`balanced`)."""
    if policy not in POLICIES:
        raise SpecError("owners", f"{policy!r} unknown; allowed: {', '.join(POLICIES)}")
    return POLICIES[policy](P, M, **profile_terms)


def encoder_owners(plan) -> Optional[Tuple[str, List[int]]]:
    """(region, owner device of each micro-batch) of the plan's first transposed region, read off the
    derived programs: the device running the forward of micro-batch m's first chunk of that region
    (this step's or, with next-step spill, the one done a step ahead). None: no transposed region
    (its encoder forwards have no owners to balance)."""
    regions = [s["region"] for s in plan.schedule if s.get("skeleton") == "transpose"]
    if not regions:
        return None
    region = regions[0]
    owner: dict = {}
    for d, prog in sorted(plan.programs.items()):
        for a in prog:
            if a.kind == "F" and a.region == region and a.chunk == 0 and a.micro is not None:
                owner.setdefault(a.micro, d)
    if sorted(owner) != list(range(plan.num_micro)):
        return None
    return region, [owner[m] for m in range(plan.num_micro)]
