"""Lowering: per-device compute sequences -> per-device programs, as a list of named passes.

Each pass is a pure function ``(facts, state) -> state``: it reads what the passes before it
added to the frozen :class:`Lowering` state and returns a copy with its own field filled in,
never changing its input (the pass-list style of torch's pipelining ``_add_send_recv`` and of
zero-bubble's schedule passes; the code is this project's own). :func:`lower` runs
:data:`PASSES` in order:

1. ``locate``: the slot (device, index, step) of every compute task;
2. ``edges``: one :class:`Message` per cross-device producer -> consumer edge;
3. ``fifo_receives``: where each RECV goes so that every device pair sees one FIFO sequence,
   and after which compute task each SEND goes;
4. ``collectives``: the program head (broadcasts) and tail (all-reduces, all-gathers);
5. ``assemble``: each device's program from its sequence, receives, sends and collectives.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .ir import (ACT, ALLGATHER, ALLREDUCE, BROADCAST, B, BW, DP_GROUP, F, GRAD, R, RECV, REDUCESCATTER, SEND, W, WEIGHTS,
                 WGRAD, Action)
from .schedule import Transpose


class Slot(NamedTuple):
    """Where a compute task sits: device, position in its compute sequence, step (1 = next step)."""

    device: int
    index: int
    step: int


class Message(NamedTuple):
    """One cross-device edge: ``tensor`` of (region, chunk, micro) from ``src`` to ``dst``."""

    src: int
    dst: int
    src_index: int   # producer's position in the sender's compute sequence
    dst_index: int   # consumer's position in the receiver's compute sequence
    next_step: bool  # produced by next-step (spilled) work for this step's consumer
    tensor: str
    region: str
    chunk: int
    micro: int


class Receive(NamedTuple):
    """A RECV to place before a consumer: sender, position on the sender's channel, the message."""

    src: int
    k: int
    msg: Message


class Facts(NamedTuple):
    """What the passes read of the derivation (fixed for one lowering)."""

    P: int
    D: int
    upstream: Tuple[Tuple[str, object], ...]         # (region, skeleton) of every region before the body
    trainable: Mapping[str, bool]
    body: str
    body_root: int                                    # device of the body's first forward (broadcast root)
    tied_reduces: Tuple[Action, ...]
    pairs: Mapping[int, Mapping]                      # device -> overlap pair id of (kind, chunk, micro)
    prev: Callable[[str, int], Optional[Tuple[str, int]]]
    next: Callable[[str, int], Optional[Tuple[str, int]]]
    zero: int = 0                                     # ZeRO level over the data-parallel group (0, 1, 2)


@dataclass(frozen=True)
class Lowering:
    """The state the passes fill in, field by field (``None`` until its pass ran)."""

    seqs: Mapping[int, Sequence]                                       # input: compute tasks per device
    loc: Optional[Mapping[Tuple[str, str, int, int], Slot]] = None     # locate
    messages: Optional[Tuple[Message, ...]] = None                     # edges
    trailing: Optional[Mapping[int, int]] = None                       # fifo_receives
    recvs_at: Optional[Mapping[int, Mapping[int, Tuple[Receive, ...]]]] = None
    sends_after: Optional[Mapping[int, Mapping[int, Tuple[Message, ...]]]] = None
    head: Optional[Tuple[Action, ...]] = None                          # collectives
    tail: Optional[Tuple[Action, ...]] = None
    programs: Optional[Dict[int, List[Action]]] = None                 # assemble


def trailing_start(seq: Sequence) -> int:
    """Index where a device's trailing block of next-step tasks starts (len(seq) if none)."""
    i = len(seq)
    while i > 0 and seq[i - 1].step:
        i -= 1
    return i


def locate(facts: Facts, s: Lowering) -> Lowering:
    """Adds ``loc``: the slot of every compute task, keyed by (kind, region, chunk, micro)."""
    loc = {}
    for d, seq in s.seqs.items():
        for i, t in enumerate(seq):
            loc[(t.kind, t.region, t.chunk, t.micro)] = Slot(d, i, t.step)
    return replace(s, loc=loc)


def edges(facts: Facts, s: Lowering) -> Lowering:
    """Adds ``messages``: an activation for every forward (and central recompute) whose input is made on
    another device, and a gradient for every backward whose output gradient is made on another device."""
    loc = s.loc

    def input_grad_task(region: str, chunk: int, m: int):
        for kind in (B, BW):
            if (kind, region, chunk, m) in loc:
                return loc[(kind, region, chunk, m)]
        return None

    messages: List[Message] = []
    for d, seq in s.seqs.items():
        for i, t in enumerate(seq):
            if t.kind == F:
                prev = facts.prev(t.region, t.chunk)
                if prev is None or (F,) + prev + (t.micro,) not in loc:
                    continue  # data, or (body-only timing) an upstream producer not lowered here
                pd, pi, pstep = loc[(F,) + prev + (t.micro,)]
                if pd != d:
                    messages.append(Message(pd, d, pi, i, pstep > t.step, ACT, prev[0], prev[1], t.micro))
            elif t.kind == R:
                # central backward recomputes from the shipped input: the input of the region
                # travels to the central device unless its own forward already runs there
                prev = facts.prev(t.region, t.chunk)
                if prev is None or loc[(F, t.region, t.chunk, t.micro)].device == d:
                    continue
                pd, pi, pstep = loc[(F,) + prev + (t.micro,)]
                if pd != d:
                    messages.append(Message(pd, d, pi, i, pstep > t.step, ACT, prev[0], prev[1], t.micro))
            elif t.kind in (B, BW):
                nxt = facts.next(t.region, t.chunk)
                if nxt is None:
                    continue
                src = input_grad_task(nxt[0], nxt[1], t.micro)
                if src is None:
                    raise AssertionError(f"no input-grad producer for {t}")
                if src.device != d:
                    messages.append(Message(src.device, d, src.index, i, False, GRAD, t.region, t.chunk, t.micro))
    return replace(s, messages=tuple(messages))


def fifo_receives(facts: Facts, s: Lowering) -> Lowering:
    """Adds ``trailing``, ``recvs_at`` and ``sends_after``: the SENDs of a compute task go right after it;
    per channel, receives follow the sender's order, a receive pulled earlier when a later-needed message
    is sent first. Messages crossing into the next step (spilled producer, this-step consumer) are sent
    after the step's collectives and received at the very end of the receiver's step, so every step's
    traffic is complete before anything that runs between steps (optimizer, metrics, checkpoints)."""
    recvs_at: Dict[int, Dict[int, List[Receive]]] = {}
    sends_after: Dict[int, Dict[int, List[Message]]] = {}
    channels: Dict[Tuple[int, int], List[Message]] = {}
    # each device's trailing block of next-step work runs after the collectives (see assemble)
    trailing = {d: trailing_start(seq) for d, seq in s.seqs.items()}
    for msg in s.messages:
        channels.setdefault((msg.src, msg.dst), []).append(msg)
        sends_after.setdefault(msg.src, {}).setdefault(msg.src_index, []).append(msg)
    for (src, dst), msgs in channels.items():
        # the order the sender emits them: its program part, then its after-collectives part
        msgs.sort(key=lambda x: (x.next_step or x.src_index >= trailing[src], x.src_index))
        end = len(s.seqs[dst])
        pos = None
        placed = []
        for k in range(len(msgs) - 1, -1, -1):
            need = end if msgs[k].next_step else msgs[k].dst_index
            pos = need if pos is None else min(pos, need)
            placed.append((pos, k, msgs[k]))
        for pos, k, msg in placed:
            recvs_at.setdefault(dst, {}).setdefault(pos, []).append(Receive(src, k, msg))
    return replace(s, trailing=trailing,
                   recvs_at={d: {i: tuple(v) for i, v in at.items()} for d, at in recvs_at.items()},
                   sends_after={d: {i: tuple(v) for i, v in at.items()} for d, at in sends_after.items()})


def collectives(facts: Facts, s: Lowering) -> Lowering:
    """Adds ``head`` and ``tail``: the broadcast of each central-backward region's weights before the step;
    after it the all-reduce of each replicated region's gradients, of each tied weight's copies, of the
    data-parallel group, then the all-gather of each sharded-optimizer region's updated weights. With ZeRO
    over the data-parallel group (``zero`` 1: optimizer state sharded; 2: gradients too) the data-parallel
    all-reduce is kept (1) or becomes a reduce-scatter (2), and an all-gather of the updated weights over
    the group ends the step."""
    everyone = tuple(range(facts.P))
    head: List[Action] = []
    tail: List[Action] = []
    if facts.P > 1:
        for r, sk in facts.upstream:
            if isinstance(sk, Transpose) and facts.trainable[r]:
                if sk.backward == "central":
                    head.append(Action(BROADCAST, region=r, tensor=WEIGHTS, group=everyone, root=facts.body_root))
                else:
                    tail.append(Action(ALLREDUCE, region=r, tensor=WGRAD, group=everyone))
    # tied weights: each copy's gradient summed over the devices holding one, before clipping and the
    # optimizer (the members only; every member reaches it at the same place: its program's end)
    tail.extend(facts.tied_reduces)
    if facts.D > 1:
        # ZeRO-2: the regions of early_scatter(facts) are reduce-scattered after their last weight-gradient
        # task on each device (assemble); this one takes every gradient not scattered yet
        tail.append(Action(REDUCESCATTER if facts.zero == 2 else ALLREDUCE, tensor=WGRAD, group=DP_GROUP))
    if facts.P > 1:
        # sharded optimizer state: after every gradient is reduced, each device updates its share of
        # the region and the updated parameters are gathered to every replica, within the step
        for r, sk in facts.upstream:
            if isinstance(sk, Transpose) and facts.trainable[r] and sk.optimizer == "sharded":
                tail.append(Action(ALLGATHER, region=r, tensor=WEIGHTS, group=everyone))
    if facts.D > 1 and facts.zero:
        # ZeRO: each data-parallel rank steps its share of every region it updates, then the group gathers
        tail.append(Action(ALLGATHER, tensor=WEIGHTS, group=DP_GROUP))
    return replace(s, head=tuple(head), tail=tuple(tail))


def early_scatter(facts: Facts) -> frozenset:
    """ZeRO-2's regions whose gradients are complete on a device after its last weight-gradient task (W or
    BW) of the region there: every trained region but those summed over pipeline devices at the tail first
    (a replicated encoder's all-reduce, a tied weight's copies). Their ``REDUCESCATTER wgrad dp`` goes right
    after that task (and its sends): the device then holds only its share of them for the rest of the step."""
    if facts.D < 2 or facts.zero != 2:
        return frozenset()
    late = {a.region for a in facts.tied_reduces}
    if facts.P > 1:
        late |= {r for r, sk in facts.upstream if isinstance(sk, Transpose) and sk.backward != "central"}
    return frozenset(r for r, ok in facts.trainable.items() if ok and r not in late)


def assemble(facts: Facts, s: Lowering) -> Lowering:
    """Adds ``programs``: per device the head, then each compute task with its receives before and its sends
    after, then the tail collectives it is a member of, then its next-step work: forwards in the trailing
    block run after the collectives (their receives too); spilled forwards placed earlier (in idle gaps)
    run in place, but every next-step SEND goes after the collectives (the first messages of the next step
    on its channel)."""

    def p2p(kind: str, msg: Message, peer: int) -> Action:
        # step=1: the tensor is next-step data (its producer is a spilled forward)
        step = s.seqs[msg.src][msg.src_index].step
        return Action(kind, region=msg.region, chunk=msg.chunk, micro=msg.micro, peer=peer, tensor=msg.tensor,
                      step=step)

    def receives(d: int, i: int) -> List[Receive]:
        return sorted(s.recvs_at.get(d, {}).get(i, ()), key=lambda x: (x.src, x.k))

    early = early_scatter(facts)
    programs: Dict[int, List[Action]] = {}
    for d, seq in s.seqs.items():
        prog = list(s.head)
        pairs = facts.pairs.get(d)
        spilled: List[Action] = []
        # ZeRO-2: the last weight-gradient task of each early-scattered region here
        last_w = {t.region: i for i, t in enumerate(seq) if t.kind in (W, BW) and t.region in early and not t.step}
        for i, t in enumerate(seq):
            out = spilled if i >= s.trailing[d] else prog
            for src, k, msg in receives(d, i):
                out.append(p2p(RECV, msg, src))
            pair = pairs.get((t.kind, t.chunk, t.micro)) if pairs and t.region == facts.body else None
            out.append(Action(t.kind, region=t.region, chunk=t.chunk, micro=t.micro, step=t.step, pair=pair))
            for msg in s.sends_after.get(d, {}).get(i, ()):
                (spilled if msg.next_step else out).append(p2p(SEND, msg, msg.dst))
            if last_w.get(t.region) == i:
                out.append(Action(REDUCESCATTER, region=t.region, tensor=WGRAD, group=DP_GROUP))
        for src, k, msg in receives(d, len(seq)):
            spilled.append(p2p(RECV, msg, src))
        tail = [a for a in s.tail if not isinstance(a.group, tuple) or d in a.group]
        held = {t.region for t in seq if t.kind in (W, BW) and facts.trainable.get(t.region, True)}
        if held and held <= set(last_w):   # every gradient here is scattered already: no tail reduce-scatter
            tail = [a for a in tail if a.kind != REDUCESCATTER]
        programs[d] = prog + tail + spilled
    return replace(s, programs=programs)


PASSES: Tuple[Callable[[Facts, Lowering], Lowering], ...] = (locate, edges, fifo_receives, collectives, assemble)


def lower(facts: Facts, seqs: Mapping[int, Sequence]) -> Dict[int, List[Action]]:
    """Per-device programs of the compute sequences ``seqs``: :data:`PASSES` run in order."""
    state = Lowering(seqs=seqs)
    for step in PASSES:
        state = step(facts, state)
    return state.programs
