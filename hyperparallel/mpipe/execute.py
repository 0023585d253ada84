"""Execute per-device programs with given durations: the engine behind check and cost.

Each device has a host sequence (its program, in order) plus a comm lane.
Compute actions occupy the host; a SEND is buffered: the host moves on and
the transfer occupies the sender's comm lane, arriving at the peer when done;
a RECV blocks the host until its message has arrived; a collective blocks
every member until all have reached it, then takes its duration on all.
Messages on each ordered device pair form one FIFO queue (as on MCCL).
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import PlanError
from .ir import COLLECTIVE_KINDS, COMPUTE_KINDS, DP_GROUP, RECV, SEND, Action, Plan


@dataclass
class Timed:
    device: int
    index: int
    step: int
    action: Action
    start: float
    end: float
    lane: str  # "compute" or "comm"


@dataclass
class Execution:
    timeline: Dict[int, List[Timed]] = field(default_factory=dict)
    step_ends: List[float] = field(default_factory=list)


def msg_key(a: Action) -> Tuple:
    return (a.tensor, a.region, a.chunk, a.micro)


def coll_key(a: Action) -> Tuple:
    return (a.kind, a.tensor, a.region, a.group, a.root)


def execute(plan: Plan, compute_ms: Callable[[Action], float], comm_ms: Callable[[Action], float],
            steps: int = 1, device_scale: Optional[Sequence[float]] = None) -> Execution:
    """Run ``steps`` consecutive optimizer steps; raise PlanError on deadlock or FIFO mismatch.

    Next-step (``step=1``, spill) work and its messages complete within the step
    that does them; the first step's share is the prologue's (not timed here).
    ``device_scale[d]`` multiplies every compute duration on device d (devices of unequal speed).
    """
    P = plan.num_devices
    progs = {d: plan.programs.get(d, []) for d in range(P)}
    n = {d: len(p) for d, p in progs.items()}
    total = {d: n[d] * steps for d in range(P)}
    pc = {d: 0 for d in range(P)}
    host = {d: 0.0 for d in range(P)}
    lane = {d: 0.0 for d in range(P)}
    chan: Dict[Tuple[int, int], deque] = defaultdict(deque)
    ex = Execution(timeline={d: [] for d in range(P)})
    step_end = [0.0] * steps
    compute = {d: [a.kind in COMPUTE_KINDS for a in progs[d]] for d in range(P)}
    scale = [float(device_scale[d]) if device_scale and d < len(device_scale) else 1.0 for d in range(P)]

    def q(src: int, dst: int) -> deque:
        return chan[(src, dst)]


    def record(d: int, i: int, a: Action, start: float, end: float, kind: str) -> None:
        s = i // n[d] if n[d] else 0
        ex.timeline[d].append(Timed(d, i % n[d], s, a, start, end, kind))
        step_end[s] = max(step_end[s], end)

    def blocked_on(d: int) -> str:
        a = progs[d][pc[d] % n[d]]
        if a.kind == RECV:
            return f"device {d} action {pc[d] % n[d]} ({a.label()}) waits for a message from device {a.peer}"
        return f"device {d} action {pc[d] % n[d]} ({a.label()}) waits for the other members of the collective"

    while True:
        progress = False
        for d in range(P):
            prog, comp, nd, tl = progs[d], compute[d], n[d], ex.timeline[d]
            while pc[d] < total[d]:
                i = pc[d]
                s, j = divmod(i, nd)
                a = prog[j]
                if comp[j]:
                    start = host[d]
                    end = start + compute_ms(a) * scale[d]
                    tl.append(Timed(d, j, s, a, start, end, "compute"))
                    if end > step_end[s]:
                        step_end[s] = end
                    host[d] = end
                    pc[d] = i + 1
                    progress = True
                    continue
                elif a.kind == SEND:
                    start = max(host[d], lane[d])
                    end = start + comm_ms(a)
                    lane[d] = end
                    q(d, a.peer).append((msg_key(a), end, d, i % n[d]))
                    record(d, i, a, start, end, "comm")
                elif a.kind == RECV:
                    box = q(a.peer, d)
                    if not box:
                        break
                    key, arrival, src, si = box[0]
                    if key != msg_key(a):
                        raise PlanError(f"FIFO mismatch: device {d} action {i % n[d]} ({a.label()}) expects "
                                        f"{msg_key(a)} but the next message from device {a.peer} is {key} "
                                        f"(its action {si})")
                    box.popleft()
                    end = max(host[d], arrival)
                    record(d, i, a, host[d], end, "comm")
                    host[d] = end
                elif a.kind in COLLECTIVE_KINDS:
                    if a.group == DP_GROUP or not a.group or a.group == (d,):
                        members = [d]
                    elif isinstance(a.group, str):   # only "dp" names a group; any other name has no member list
                        raise PlanError(f"device {d} action {i % n[d]} ({a.label()}): group {a.group!r} is not "
                                        f"a group: give {DP_GROUP!r} or a tuple of devices")
                    else:
                        members = list(a.group)
                    ready = True
                    for m in members:
                        if m == d:
                            continue
                        if pc[m] >= total[m] or pc[m] // n[m] != s:
                            ready = False
                            break
                        b = progs[m][pc[m] % n[m]]
                        # a member still at another action, or at its own data-parallel collective: wait
                        if b.kind not in COLLECTIVE_KINDS or b.group == DP_GROUP:
                            ready = False
                            break
                        if coll_key(b) != coll_key(a):
                            raise PlanError(f"collective mismatch: device {d} action {i % n[d]} ({a.label()}) "
                                            f"meets device {m} action {pc[m] % n[m]} ({b.label()})")
                    if not ready:
                        break
                    start = max(max(host[m], lane[m]) for m in members)
                    end = start + comm_ms(a)
                    for m in members:
                        j = pc[m]
                        record(m, j, progs[m][j % n[m]], start, end, "comm")
                        host[m] = lane[m] = end
                        if m != d:
                            pc[m] += 1
                else:
                    raise PlanError(f"device {d} action {i % n[d]}: unknown kind {a.kind!r}")
                pc[d] += 1
                progress = True
        if all(pc[d] >= total[d] for d in range(P)):
            break
        if not progress:
            stuck = [blocked_on(d) for d in range(P) if pc[d] < total[d]]
            raise PlanError("deadlock: " + "; ".join(stuck))
    ex.step_ends = step_end
    return ex
