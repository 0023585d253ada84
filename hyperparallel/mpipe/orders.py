"""Order rules of the ``pipe`` skeleton: (P, V, M, device) -> that device's compute sequence.

Chunk ``c`` of the pipelined region lives on device ``c mod P`` (the "loop"
placement), so device d holds chunks ``d, d+P, ..., d+(V-1)P``. Each rule
returns ``[(kind, chunk, micro), ...]`` with kind ``F`` and either ``BW``
(fused backward) or ``B``/``W`` (split, zero-bubble). Every order is a few
lines over the same primitives; no other module writes a schedule loop.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from .errors import SpecError
from .ir import B, BW, F, W

Task = Tuple[str, int, int]


def _local_chunks(P: int, V: int, d: int) -> List[int]:
    return [v * P + d for v in range(V)]


def gpipe(P: int, V: int, M: int, d: int) -> List[Task]:
    """All forwards (chunk by chunk), then all backwards in reverse chunk order."""
    chunks = _local_chunks(P, V, d)
    seq = [(F, c, m) for c in chunks for m in range(M)]
    seq += [(BW, c, m) for c in reversed(chunks) for m in range(M)]
    return seq


def _one_f_one_b(forwards: List[Task], backwards: List[Task], warmup: int) -> List[Task]:
    """Warmup forwards, then steady (one forward, one backward), then cooldown backwards."""
    warmup = min(warmup, len(forwards))
    seq = forwards[:warmup]
    for i in range(len(forwards) - warmup):
        seq += [forwards[warmup + i], backwards[i]]
    seq += backwards[len(forwards) - warmup:]
    return seq


def one_f_one_b(P: int, V: int, M: int, d: int) -> List[Task]:
    """1F1B: P-1-d warmup forwards keep at most P-d micro-batches in flight on device d."""
    return _one_f_one_b([(F, d, m) for m in range(M)], [(BW, d, m) for m in range(M)], P - 1 - d)


def interleaved(P: int, V: int, M: int, d: int) -> List[Task]:
    """Interleaved 1F1B (Megatron-style): micro-batches in groups of P cycle over the V local chunks."""
    if V == 1:
        return one_f_one_b(P, V, M, d)
    def order(k: int, backward: bool) -> Tuple[int, int]:
        group, pos = divmod(k, P)
        v = group % V
        if backward:
            v = V - 1 - v
        return v * P + d, (group // V) * P + pos

    total = V * M
    fwd = [(F,) + order(k, False) for k in range(total)]
    bwd = [(BW,) + order(k, True) for k in range(total)]
    warmup = total if M == P else (P - d - 1) * 2 + (V - 1) * P
    return _one_f_one_b(fwd, bwd, warmup)


def zb_h1(P: int, V: int, M: int, d: int) -> List[Task]:
    """ZB-H1: 1F1B with B and W split; the input grad goes upstream right after B.

    In the cooldown each W on devices after the first waits one B (it fills the wait for the
    next input grad); the first device runs W right after B (its last W ends the step, so a
    lag would only lengthen it). W still runs before the next forward, so device d keeps at
    most P-d micro-batches' activations, the same as 1F1B.
    """
    fused = one_f_one_b(P, V, M, d)
    seq: List[Task] = []
    pending: List[Task] = []
    forwards_left = M
    for kind, c, m in fused:
        if kind == F:
            seq += [(W, pc, pm) for _, pc, pm in pending]
            pending = []
            forwards_left -= 1
            seq.append((F, c, m))
        else:
            seq.append((B, c, m))
            if forwards_left > 0:
                seq.append((W, c, m))  # steady state: W before the next forward keeps memory at 1F1B's
            elif d == 0:
                seq += [(W, pc, pm) for _, pc, pm in pending] + [(W, c, m)]
                pending = []
            else:
                seq += [(W, pc, pm) for _, pc, pm in pending]  # cooldown: W lags one B
                pending = [(W, c, m)]
    seq += pending
    return seq


ORDER_RULES: Dict[str, Callable[[int, int, int, int], List[Task]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb_h1": zb_h1,
}
SPLIT_ORDERS = ("zb_h1",)


def validate(order: str, P: int, V: int, M: int) -> None:
    """Refuse (order, P, V, M) combinations the rule does not define."""
    if order not in ORDER_RULES:
        raise SpecError("order", f"{order!r} unknown; allowed: {', '.join(ORDER_RULES)}")
    if order in ("1f1b", "zb_h1") and V != 1:
        raise SpecError("parallel_config.pp_interleave_num",
                        f"must be 1 for order {order!r}, got {V}; use order 'interleaved' or 'gpipe' for V > 1")
    if order == "interleaved" and V > 1 and M % P != 0:
        raise SpecError("parallel_config.micro_batch_num",
                        f"must be a multiple of pipeline_stage ({P}) for order 'interleaved', got {M}")


def device_order(order: str, P: int, V: int, M: int, d: int) -> List[Task]:
    validate(order, P, V, M)
    return ORDER_RULES[order](P, V, M, d)
