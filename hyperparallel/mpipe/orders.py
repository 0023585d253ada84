"""Order rules of the ``pipe`` skeleton: (P, V, M, device) -> that device's compute sequence.

Two placements of the pipelined region's ``P*V`` chunks:

* ``loop``: chunk ``c`` on device ``c mod P`` (device d holds ``d, d+P, ..., d+(V-1)P``);
* ``vshape`` (the design's "fold", V = 2): chunk ``c`` on device ``c`` for ``c < P`` and on
  ``2P-1-c`` after, so device d holds chunks ``d`` and ``2P-1-d`` and the first and last chunk
  (the loss) share device 0.

Each rule returns ``[(kind, chunk, micro), ...]`` with kind ``F`` and either ``BW`` (fused
backward) or ``B``/``W`` (split, zero-bubble). The closed-form rules (gpipe, 1f1b,
interleaved) are a few lines over :func:`_one_f_one_b`; DualPipeV is its published phase
list (:func:`dualpipev_template`); zb_h1, interleaved_zb and zbv take the F/B order of 1f1b,
interleaved (one warmup forward per hop) and DualPipeV (input grad first in each overlap pair)
and place each W where the device would otherwise wait or hold more than its cap
(:func:`_fill_w`, played with the body's per-chunk costs and free communication). The caps
(chunk activations, each held from its forward to its W) are torch's: (V-1) x first round + P
for interleaved_zb, 2P for zbv. ``interleaved_zb_fast`` and ``zbv_fast`` keep Megatron's warmup
and DualPipeV's pair order with looser caps: a shorter step for more memory. Every rule is a
pure function; no other module writes a schedule loop.
"""
from __future__ import annotations

import heapq
from functools import lru_cache
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import SpecError
from .ir import B, BW, F, W

Task = Tuple[str, int, int]
Costs = Tuple[float, float, float]  # per-chunk forward, input-grad, weight-grad times
UNIT: Costs = (1.0, 1.0, 1.0)

LOOP, VSHAPE = "loop", "vshape"


# -- placement -------------------------------------------------------------------------
def placement(name: str) -> str:
    """The placement of order ``name``'s chunks: ``loop`` or ``vshape`` (see the module docstring)."""
    return ORDERS[name].placement


def device_of(order: str, chunk: int, P: int) -> int:
    """Device of chunk ``chunk`` of the pipelined region under ``order``'s placement."""
    if placement(order) == VSHAPE:
        return chunk if chunk < P else 2 * P - 1 - chunk
    return chunk % P


def local_chunks(order: str, P: int, V: int, d: int) -> List[int]:
    return [c for c in range(P * V) if device_of(order, c, P) == d]


# -- closed-form rules -------------------------------------------------------------------
def gpipe(P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
    """All forwards (chunk by chunk), then all backwards in reverse chunk order."""
    chunks = local_chunks("gpipe", P, V, d)
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


def one_f_one_b(P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
    """1F1B: P-1-d warmup forwards keep at most P-d micro-batches in flight on device d."""
    return _one_f_one_b([(F, d, m) for m in range(M)], [(BW, d, m) for m in range(M)], P - 1 - d)


def rounds(P: int, M: int) -> List[int]:
    """Micro-batch rounds of interleaved orders: ``M // P`` rounds as even as possible (each >= P)."""
    n = max(1, M // P)
    base, extra = divmod(M, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _interleaved(P: int, V: int, M: int, d: int, hop: int) -> List[Task]:
    """Interleaved F/BW order: micro-batches in rounds (each >= P) cycle over the V local chunks;
    warmup forwards ``(V-1) * first round + hop * (P-1-d)``."""
    if V == 1:
        return one_f_one_b(P, V, M, d)
    fwd: List[Task] = []
    start = 0
    for size in rounds(P, M):
        for v in range(V):
            fwd += [(F, v * P + d, m) for m in range(start, start + size)]
        start += size
    bwd = [(BW, (V - 1 - c // P) * P + d, m) for _, c, m in fwd]
    return _one_f_one_b(fwd, bwd, (V - 1) * rounds(P, M)[0] + hop * (P - 1 - d))


def interleaved(P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
    """Interleaved 1F1B: micro-batches in rounds (each >= P) cycle over the V local chunks.

    Any M >= P: the rounds are ``M // P`` groups as even as possible. Warmup forwards
    ``(V-1) * first round + 2(P-1-d)`` (Megatron's count), so device d holds at most one more.
    """
    return _interleaved(P, V, M, d, 2)


# -- zero-bubble family ----------------------------------------------------------------------
def _split(seq: List[Task]) -> List[Task]:
    return [(B, c, m) if k == BW else (k, c, m) for k, c, m in seq]


def _fill_w(P: int, M: int, costs: Costs, templates: Dict[int, List[Task]], cap: List[int]) -> Dict[int, List[Task]]:
    """Place the weight grads: play the F/B templates forward with per-chunk ``costs`` and free
    communication; each device runs its template in order, and a pending ``W`` (oldest first)
    whenever the next template task is not ready yet (a bubble) or the device already holds
    ``cap[d]`` chunk activations (an activation lives from its forward to its ``W``). The W's
    left at the end close the sequence. The result is a static order; any durations run it.
    """
    f, b, w = costs
    last = max(c for tp in templates.values() for _, c, _ in tp)
    fdone: Dict[Tuple[int, int], float] = {}
    bdone: Dict[Tuple[int, int], float] = {}
    at = [0] * P
    held = [0] * P
    free = [0.0] * P
    pend: List[List[Task]] = [[] for _ in range(P)]
    seqs: Dict[int, List[Task]] = {d: [] for d in range(P)}

    def ready(kind: str, c: int, m: int) -> Optional[float]:
        if kind == F:
            return 0.0 if c == 0 else fdone.get((c - 1, m))
        if (c, m) not in fdone:
            return None
        up = fdone[(c, m)] if c == last else bdone.get((c + 1, m))
        return None if up is None else max(up, fdone[(c, m)])

    def run(d: int, task: Task, start: float) -> float:
        kind, c, m = task
        end = start + {F: f, B: b, W: w}[kind]
        if kind == F:
            fdone[(c, m)] = end
            held[d] += 1
        elif kind == B:
            bdone[(c, m)] = end
            pend[d].append((W, c, m))
        else:
            held[d] -= 1
        seqs[d].append(task)
        free[d] = end
        return end

    heap = [(0.0, d) for d in range(P)]
    asleep: List[int] = []
    while heap:
        t, d = heapq.heappop(heap)
        tp = templates[d]
        if at[d] == len(tp):
            while pend[d]:
                run(d, pend[d].pop(0), free[d])
            continue
        task = tp[at[d]]
        r = ready(*task)
        fits = task[0] != F or held[d] < cap[d]
        now = max(t, free[d])
        if r is not None and r <= now and fits:
            at[d] += 1
            end = run(d, task, now)
        elif pend[d]:
            end = run(d, pend[d].pop(0), now)
        elif r is not None and fits:
            heapq.heappush(heap, (r, d))  # idle until the next template task is ready
            continue
        else:
            asleep.append(d)  # waits for another device's progress
            continue
        heapq.heappush(heap, (end, d))
        for x in asleep:
            heapq.heappush(heap, (max(free[x], end), x))
        asleep = []
    if any(at[d] < len(templates[d]) for d in range(P)):
        raise AssertionError("W placement stuck: the template needs a larger activation cap")
    return seqs


def dualpipev_template(P: int, M: int, d: int) -> List[Tuple[str, int, int, int]]:
    """DualPipeV's phases on device d (chunk 0 = d, chunk 1 = 2P-1-d), M >= 2P-1.

    Returns ``(kind, chunk, micro, pair)``: ``pair`` > 0 marks a forward of one micro-batch and
    the input-grad of another that DualPipeV overlaps (same id on both), else 0. Phases:
    nF0, nF0F1, nB1W1F1, main (F0&B1, F1&B0), nB1 F1&B0, nB1B0 (second half zero-bubble:
    W deferred), nWB0, nW.
    """
    c0, c1 = d, 2 * P - 1 - d
    nxt = {(F, c0): 0, (F, c1): 0, (B, c0): 0, (B, c1): 0}
    seq: List[Tuple[str, int, int, int]] = []
    wq: List[Tuple[str, int, int, int]] = []
    pairs = [0]

    def op(kind: str, c: int, defer_w: bool = False, pair: int = 0) -> None:
        m = nxt[(kind, c)]
        nxt[(kind, c)] += 1
        seq.append((kind, c, m, pair))
        if kind == B:
            (wq if defer_w else seq).append((W, c, m, 0))

    def paired(fc: int, bc: int) -> None:
        pairs[0] += 1
        op(F, fc, pair=pairs[0])
        op(B, bc, pair=pairs[0])

    for _ in range(2 * (P - d - 1)):
        op(F, c0)
    for _ in range(d + 1):
        op(F, c0), op(F, c1)
    for _ in range(P - d - 1):
        op(B, c1), op(F, c1)
    for _ in range(M - 2 * P + d + 1):
        paired(c0, c1), paired(c1, c0)
    for _ in range(P - d - 1):
        op(B, c1), paired(c1, c0)
    zb = False
    for i in range(d + 1):
        zb = zb or (i == (d + 1) // 2 and d % 2 == 1)
        op(B, c1, zb)
        zb = zb or (i == (d + 1) // 2 and d % 2 == 0)
        op(B, c0, zb)
    for _ in range(P - d - 1):
        if wq:
            seq.append(wq.pop(0))
        op(B, c0, True)
    return seq + wq


def _b_first(seq: List[Tuple[str, int, int, int]]) -> List[Task]:
    """DualPipeV's phases without its W's, each overlap pair run input-grad first (frees before it holds)."""
    out: List[Task] = []
    for i, (k, c, m, p) in enumerate(seq):
        if k == W:
            continue
        if p and k == F and i + 1 < len(seq) and seq[i + 1][3] == p:
            out.append(seq[i + 1][:3])
        if not (p and k == B and i > 0 and seq[i - 1][3] == p):
            out.append((k, c, m))
    return out


@lru_cache(maxsize=64)
def _zero_bubble(order: str, P: int, V: int, M: int, costs: Costs) -> Dict[int, List[Task]]:
    """Per-device sequences of a zero-bubble order (activation caps count chunks held from F to W)."""
    if order == "zb_h1":
        # 1F1B's F/B order; W fills the bubbles; at most P micro-batches held (1F1B's device 0)
        return _fill_w(P, M, costs, {d: _split(one_f_one_b(P, V, M, d)) for d in range(P)}, [P] * P)
    if order == "interleaved_zb":
        # warmup one forward per hop (not Megatron's two); at most (V-1) * first round + P chunks held
        cap = [min(V * M, (V - 1) * rounds(P, M)[0] + P)] * P
        return _fill_w(P, M, costs, {d: _split(_interleaved(P, V, M, d, 1)) for d in range(P)}, cap)
    if order == "interleaved_zb_fast":
        # interleaved 1F1B's F/B order; W fills the bubbles within P more chunk activations
        cap = [min(V * M, (V - 1) * rounds(P, M)[0] + 2 * (P - 1 - d) + 1 + P) for d in range(P)]
        return _fill_w(P, M, costs, {d: _split(interleaved(P, V, M, d)) for d in range(P)}, cap)
    if order == "zbv":
        # DualPipeV's F/B order, each pair input-grad first; W fills the bubbles within 2P chunk activations
        tpl = {d: _b_first(dualpipev_template(P, M, d)) for d in range(P)}
        return _fill_w(P, M, costs, tpl, [2 * P] * P)
    if order == "zbv_fast":
        # DualPipeV's F/B order on the V-shape, no overlap; W fills the bubbles within 2P+1 chunk activations
        tpl = {d: [(k, c, m) for k, c, m, _ in dualpipev_template(P, M, d) if k != W] for d in range(P)}
        return _fill_w(P, M, costs, tpl, [2 * P + 1] * P)
    raise KeyError(order)


def _zb_rule(order: str) -> Callable[..., List[Task]]:
    def rule(P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
        return list(_zero_bubble(order, P, V, M, tuple(float(x) for x in costs))[d])
    rule.__name__ = order
    rule.__doc__ = f"{order}: the order's F/B template with W placed by :func:`_fill_w`."
    return rule


def dualpipev(P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
    """DualPipeV (V-shape, V = 2): :func:`dualpipev_template` without the pair marks."""
    return [(k, c, m) for k, c, m, _ in dualpipev_template(P, M, d)]


def overlap_pairs(order: str, P: int, V: int, M: int, d: int) -> Dict[Tuple[str, int, int], int]:
    """``{(kind, chunk, micro): pair id}`` of the tasks an overlapping backend may run together."""
    if not ORDERS[order].paired:
        return {}
    return {(k, c, m): p for k, c, m, p in dualpipev_template(P, M, d) if p}


@dataclass(frozen=True)
class Order:
    """One pipe order: its rule and every property the rest of the project asks about it.

    ``V``: the chunks per device it needs (None: any); ``split``: backward as separate B and W
    actions; ``paired``: F/B pairs an overlapping backend may run together; ``min_micro``:
    the least M for (P, V); ``placement``: ``loop`` or ``vshape``; ``mindspore``: MindSpore's ``(pipeline_scheduler,
    pipeline_interleave)`` that runs this order in graph mode (None: none does, ``no_graph``
    says why); ``closed_form``: the makespan for uniform chunks and free communication,
    ``(P, V, M, f, b, w) -> float`` or None where no closed form is known for those values.
    """

    name: str
    rule: Callable[..., List[Task]]
    placement: str = LOOP
    V: Optional[int] = None
    split: bool = False
    paired: bool = False
    min_micro: Callable[[int, int], int] = lambda P, V: 1
    mindspore: Optional[Tuple[str, bool]] = None
    no_graph: str = ""
    closed_form: Optional[Callable[..., Optional[float]]] = None


def _pipe_form(P, V, M, f, b, w):
    return (M + P - 1) * (f + b + w) if V == 1 else None


def _interleaved_form(P, V, M, f, b, w):
    return V * M * (f + b + w) + (P - 1) * (f + b + w) if M >= P else None


def _zb_form(P, V, M, f, b, w):
    # the zero-bubble paper's ZB-H1 bubble (P-1)(f+b-w) for w <= f, at any V (interleaved_zb); with
    # w > f device 0 still waits (P-1)b for its first input grad (it holds at most (V-1)M/rounds + P chunks)
    return V * M * (f + b + w) + (P - 1) * (f + b - min(f, w)) if M >= P else None


def _zbv_form(P, V, M, f, b, w):
    # ZB-V on DualPipeV's F/B order with W in the bubbles (checked for f = b = 2w and w = 0; for
    # 0 < 2w < f both zbv orders beat it, so it is no form there)
    return 2 * M * (f + b + w) + (P - 1) * (f + b - 2 * w) if f == b and w in (0, f / 2) else None


_NO_ZB = ("has no MindSpore scheduler: 'zero_bubble_v' is the V-shape ZB-V schedule (order zbv)")
_NO_FAST_V = ("has no MindSpore scheduler: MindSpore's 'zero_bubble_v' runs order zbv (at most 2P chunk "
              "activations per device)")
ORDERS: Dict[str, Order] = {o.name: o for o in (
    Order("gpipe", gpipe, mindspore=("gpipe", True), closed_form=_pipe_form),
    Order("1f1b", one_f_one_b, V=1, mindspore=("1f1b", False), closed_form=_pipe_form),
    Order("interleaved", interleaved, min_micro=lambda P, V: P if V > 1 else 1, mindspore=("1f1b", True),
          closed_form=_interleaved_form),
    Order("zb_h1", _zb_rule("zb_h1"), V=1, split=True, no_graph=_NO_ZB, closed_form=_zb_form),
    Order("interleaved_zb", _zb_rule("interleaved_zb"), split=True, min_micro=lambda P, V: P if V > 1 else 1,
          no_graph=_NO_ZB, closed_form=_zb_form),
    Order("zbv", _zb_rule("zbv"), placement=VSHAPE, V=2, split=True, min_micro=lambda P, V: 2 * P - 1,
          mindspore=("zero_bubble_v", True), closed_form=_zbv_form),
    Order("dualpipev", dualpipev, placement=VSHAPE, V=2, split=True, paired=True, min_micro=lambda P, V: 2 * P - 1,
          no_graph="overlaps the forward and backward of two micro-batches, which no MindSpore scheduler "
                   "does; " + _NO_ZB),
    Order("interleaved_zb_fast", _zb_rule("interleaved_zb_fast"), split=True,
          min_micro=lambda P, V: P if V > 1 else 1, no_graph=_NO_ZB),
    Order("zbv_fast", _zb_rule("zbv_fast"), placement=VSHAPE, V=2, split=True, min_micro=lambda P, V: 2 * P - 1,
          no_graph=_NO_FAST_V, closed_form=_zbv_form),
)}
ORDER_NAMES = tuple(ORDERS)


def order(name: str, field: str = "order") -> Order:
    """The registry entry of ``name``; SpecError naming ``field`` if there is none."""
    if name not in ORDERS:
        raise SpecError(field, f"{name!r} unknown; allowed: {', '.join(ORDERS)}")
    return ORDERS[name]


def for_scheduler(scheduler: str, V: int) -> Optional[Order]:
    """The order MindSpore runs for ``pipeline_scheduler`` with V chunks per device (None: none)."""
    fits = [o for o in ORDERS.values() if o.mindspore and o.mindspore[0] == scheduler]
    exact = [o for o in fits if o.V == V] or [o for o in fits if o.V is None and (V > 1 or len(fits) == 1)]
    return (exact or fits or [None])[0]


def validate(name: str, P: int, V: int, M: int, v_key: str = "parallel_config.pp_interleave_num",
             m_key: str = "parallel_config.micro_batch_num") -> None:
    """Refuse (order, P, V, M) combinations the rule does not define; errors name ``v_key``/``m_key``."""
    o = order(name)
    if o.V == 1 and V != 1:
        raise SpecError(v_key, f"must be 1 for order {name!r}, got {V}; use order 'interleaved', 'interleaved_zb' "
                               "or 'gpipe' for V > 1")
    if o.V is not None and V != o.V:
        raise SpecError(v_key, f"must be {o.V} for order {name!r} (V-shape: two chunks per device), got {V}; "
                               f"allowed: {o.V}")
    need = o.min_micro(P, V)
    if M < need:
        what = "2 x pipeline_stage - 1" if o.V == 2 else "pipeline_stage"
        extra = f" with pp_interleave_num={V}" if o.V is None else ""
        raise SpecError(m_key, f"must be >= {what} ({need}) for order {name!r}{extra}, got {M}")


def device_order(name: str, P: int, V: int, M: int, d: int, costs: Costs = UNIT) -> List[Task]:
    validate(name, P, V, M)
    return ORDERS[name].rule(P, V, M, d, costs)
