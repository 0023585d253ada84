"""Owner policies of ``transpose``: which device runs the encoder forward of micro-batch m."""
from __future__ import annotations

from typing import List

from .errors import SpecError


def round_robin(P: int, M: int, **_) -> List[int]:
    return [m % P for m in range(M)]


def minimal(P: int, M: int, **_) -> List[int]:
    """Micro-batch m on device m for m < P, the rest on device 0."""
    return [m if m < P else 0 for m in range(M)]


def balanced(P: int, M: int, encoder_ms: float = 0.0, body_f_ms: float = 0.0, **_) -> List[int]:
    """Owner counts chosen from the profile so each device's encoder prefix fits its warmup slack.

    Device d starts its first pipelined forward about ``d * f`` after device 0
    (f = one body chunk's forward), so it can run ``floor(d * f / E)`` encoder
    forwards (E per micro-batch) without delaying its own work; device 0 has the
    least slack. Micro-batches beyond that total are spread so that the busiest
    prefixes stay as short as possible (most slack first). Micro-batches are then
    handed out in need order: device 0 consumes m in ascending order, so the
    earliest micro-batches go to the owners that finish a forward soonest.
    """
    if encoder_ms <= 0:
        return round_robin(P, M)
    counts = [0] * P
    for _ in range(M):
        # add the next micro-batch where the prefix overshoots its slack the least
        d = min(range(P), key=lambda d: ((counts[d] + 1) * encoder_ms - d * body_f_ms, -d))
        counts[d] += 1
    owners: List[int] = []
    done = [0] * P
    for _ in range(M):
        # next micro-batch goes to the owner whose next forward finishes earliest
        d = min((d for d in range(P) if done[d] < counts[d]), key=lambda d: ((done[d] + 1) * encoder_ms, -d))
        done[d] += 1
        owners.append(d)
    return owners


POLICIES = {"round_robin": round_robin, "min": minimal, "balanced": balanced}


def owner_map(policy: str, P: int, M: int, encoder_ms: float = 0.0, body_f_ms: float = 0.0) -> List[int]:
    if policy not in POLICIES:
        raise SpecError("owners", f"{policy!r} unknown; allowed: {', '.join(POLICIES)}")
    return POLICIES[policy](P, M, encoder_ms=encoder_ms, body_f_ms=body_f_ms)
