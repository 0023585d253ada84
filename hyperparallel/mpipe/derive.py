"""Derivation: (profile, schedule, P, M, V, D) -> Plan. Pure functions, no I/O.

1. placement: every F/B/W/BW/R task gets a device (cut + skeleton rules);
2. compute order per device: the body's order rule gives the main sequence,
   upstream regions are layered in as prefix (before the body), inline (next to
   the consumer on the same device) or suffix (after the body);
3. lowering: a SEND right after the producer and a RECV before the consumer for
   every cross-device edge, receives ordered so that each device pair sees one
   FIFO message sequence, and the collectives of replicated regions.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import orders
from .cut import cut
from .errors import SpecError
from .ir import (ACT, ALLREDUCE, BROADCAST, B, BW, DP_GROUP, F, GRAD, R, RECV, SEND, W, WEIGHTS, WGRAD,
                 Action, Chunk, Plan)
from .owners import owner_map
from .profile import ModelProfile
from .schedule import Pipe, Place, Schedule, Transpose, parse_schedule


class Task(NamedTuple):
    kind: str
    region: str
    chunk: int
    micro: int
    step: int = 0


def _positive(field: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(field, f"must be a whole number >= {minimum}, got {value!r}")
    return value


class _Derivation:
    """Holds the intermediate state of one derivation; ``plan()`` returns the result."""

    def __init__(self, profile: ModelProfile, schedule: Schedule, P: int, M: int, V: int, D: int):
        self.profile, self.schedule, self.P, self.M, self.V, self.D = profile, schedule, P, M, V, D
        self.regions = [r for r, _ in schedule.parts]
        self.ridx = {r: i for i, r in enumerate(self.regions)}
        self.body, self.pipe = schedule.body
        orders.validate(self.pipe.order, P, V, M)
        self.chunks = cut(profile, schedule, P, V)
        self.nchunks = defaultdict(int)
        for c in self.chunks:
            self.nchunks[c.region] += 1
        self.trainable = {r: profile.region(r).trainable for r in self.regions}
        self.needs_bwd = {r: any(self.trainable[u] for u in self.regions[: i + 1])
                          for i, r in enumerate(self.regions)}
        self._validate_upstream()
        self.owners = self._owners()

    # -- validation and placement -------------------------------------------------
    def _validate_upstream(self) -> None:
        for i, (r, sk) in enumerate(self.schedule.parts[:-1]):
            if not isinstance(sk, Transpose):
                continue
            if sk.spill == "next_step" and self.needs_bwd[r]:
                raise SpecError(f"schedule.{r}.spill",
                                "next_step is exact only for a frozen encoder; set the region (and those before "
                                "it) trainable: false, or use spill=none")
            if sk.backward == "central" and self.needs_bwd[r]:
                for u, usk in self.schedule.parts[:i]:
                    if not (isinstance(usk, Transpose) and usk.backward == "central"):
                        raise SpecError(f"schedule.{r}.backward",
                                        f"central needs every region before it transposed with backward=central "
                                        f"({u!r} is not); allowed: owner")

    def _owners(self) -> Dict[str, List[int]]:
        enc_ms = sum(self.profile.region(r).forward_ms * self.profile.region(r).layers
                     for r, sk in self.schedule.parts[:-1] if isinstance(sk, Transpose))
        body = self.profile.region(self.body)
        body_f = body.forward_ms * body.layers / (self.P * self.V)
        return {r: owner_map(sk.owners, self.P, self.M, enc_ms, body_f)
                for r, sk in self.schedule.parts[:-1] if isinstance(sk, Transpose)}

    def forward_device(self, region: str, chunk: int, m: int) -> int:
        sk = self.schedule.skeleton(region)
        if isinstance(sk, Pipe):
            return chunk % self.P
        if isinstance(sk, Place):
            return sk.device
        return self.owners[region][m]

    def backward_device(self, region: str, m: int) -> int:
        """Device of the backward of (region, chunk 0, m): its forward's, or the central device."""
        sk = self.schedule.skeleton(region)
        if isinstance(sk, Transpose) and sk.backward == "central":
            return self.forward_device(self.body, 0, m)
        return self.forward_device(region, 0, m)

    def _bwd_kind(self, region: str) -> str:
        return BW if self.trainable[region] else B

    # -- compute order ----------------------------------------------------------------
    def compute_order(self) -> Dict[int, List[Task]]:
        split = self.pipe.order in orders.SPLIT_ORDERS
        body_needs_bwd, body_trainable = self.needs_bwd[self.body], self.trainable[self.body]
        main: Dict[int, List[Task]] = {}
        for d in range(self.P):
            seq = []
            for kind, c, m in orders.device_order(self.pipe.order, self.P, self.V, self.M, d):
                if kind != F and not body_needs_bwd:
                    continue
                if kind == W and not body_trainable:
                    continue
                if kind == BW and not body_trainable:
                    kind = B
                seq.append(Task(kind, self.body, c, m))
            main[d] = seq
        prefix: Dict[int, List[Task]] = defaultdict(list)
        suffix: Dict[int, List[Task]] = defaultdict(list)

        def where(task: Task, d: int) -> Tuple[int, List[Task]]:
            for lst in (main[d], prefix[d], suffix[d]):
                if task in lst:
                    return d, lst
            raise AssertionError(f"task {task} not placed on device {d}")

        def grad_producer(region: str, m: int) -> Task:
            """The backward task that produces d loss / d output(region) for micro-batch m."""
            nxt = self.regions[self.ridx[region] + 1]
            if nxt == self.body:
                return Task(B if (split or not body_trainable) else BW, nxt, 0, m)
            return Task(self._bwd_kind(nxt), nxt, 0, m)

        for i in range(len(self.regions) - 2, -1, -1):
            r = self.regions[i]
            sk = self.schedule.skeleton(r)
            nxt = self.regions[i + 1]
            for m in range(self.M):
                d = self.forward_device(r, 0, m)
                step = 1 if isinstance(sk, Transpose) and sk.spill == "next_step" else 0
                fwd = Task(F, r, 0, m, step)
                cd, clist = where(Task(F, nxt, 0, m), self.forward_device(nxt, 0, m))
                if isinstance(sk, Place) and cd == d:
                    if clist is main[d]:
                        clist.insert(clist.index(Task(F, nxt, 0, m)), fwd)
                    else:
                        clist.append(fwd)
                elif step:
                    suffix[d].append(fwd)
                else:
                    prefix[d].append(fwd)
                if not self.needs_bwd[r]:
                    continue
                bwd = [Task(self._bwd_kind(r), r, 0, m)]
                if isinstance(sk, Transpose) and sk.backward == "central":
                    d = self.forward_device(self.body, 0, m)
                    bwd = [Task(R, r, 0, m)] + bwd
                gp = grad_producer(r, m)
                gd, glist = where(gp, self.backward_device(nxt, m))
                if not (isinstance(sk, Transpose) and sk.backward == "owner") and gd == d and glist is main[d]:
                    at = glist.index(gp) + 1
                    glist[at:at] = bwd
                else:
                    suffix[d].extend(bwd)

        kind_rank = {R: 0, F: 1, B: 2, BW: 2, W: 3}
        out = {}
        for d in range(self.P):
            pre = sorted(prefix[d], key=lambda t: (t.step, t.micro, self.ridx[t.region]))
            suf = sorted(suffix[d], key=lambda t: (t.step, t.micro,
                                                   self.ridx[t.region] if t.step else -self.ridx[t.region],
                                                   kind_rank[t.kind]))
            out[d] = pre + main[d] + suf
        return out

    # -- lowering -----------------------------------------------------------------------
    def _prev(self, region: str, chunk: int) -> Optional[Tuple[str, int]]:
        if chunk > 0:
            return region, chunk - 1
        i = self.ridx[region]
        if i == 0:
            return None
        prev = self.regions[i - 1]
        return prev, self.nchunks[prev] - 1

    def _next(self, region: str, chunk: int) -> Optional[Tuple[str, int]]:
        if chunk < self.nchunks[region] - 1:
            return region, chunk + 1
        i = self.ridx[region]
        return None if i == len(self.regions) - 1 else (self.regions[i + 1], 0)

    def lower(self, seqs: Dict[int, List[Task]]) -> Dict[int, List[Action]]:
        loc: Dict[Tuple[str, str, int, int], Tuple[int, int, int]] = {}
        for d, seq in seqs.items():
            for i, t in enumerate(seq):
                loc[(t.kind, t.region, t.chunk, t.micro)] = (d, i, t.step)

        def input_grad_task(region: str, chunk: int, m: int):
            for kind in (B, BW):
                if (kind, region, chunk, m) in loc:
                    return loc[(kind, region, chunk, m)]
            return None

        # message: (src, dst, src_index, dst_index, spilled, tensor, region, chunk, micro)
        messages = []
        for d, seq in seqs.items():
            for i, t in enumerate(seq):
                if t.kind == F:
                    prev = self._prev(t.region, t.chunk)
                    if prev is None:
                        continue
                    pd, pi, pstep = loc[(F,) + prev + (t.micro,)]
                    if pd != d:
                        messages.append((pd, d, pi, i, pstep > t.step, ACT) + prev + (t.micro,))
                elif t.kind in (B, BW):
                    nxt = self._next(t.region, t.chunk)
                    if nxt is None:
                        continue
                    src = input_grad_task(nxt[0], nxt[1], t.micro)
                    if src is None:
                        raise AssertionError(f"no input-grad producer for {t}")
                    if src[0] != d:
                        messages.append((src[0], d, src[1], i, False, GRAD, t.region, t.chunk, t.micro))

        # FIFO: per channel, receives follow the sender's order; a receive is pulled
        # earlier when a later-needed message is sent first.
        recvs_at: Dict[int, Dict[int, List[Tuple]]] = defaultdict(lambda: defaultdict(list))
        sends_after: Dict[int, Dict[int, List[Tuple]]] = defaultdict(lambda: defaultdict(list))
        channels = defaultdict(list)
        for msg in messages:
            channels[(msg[0], msg[1])].append(msg)
            sends_after[msg[0]][msg[2]].append(msg)
        for (src, dst), msgs in channels.items():
            msgs.sort(key=lambda x: (not x[4], x[2]))
            pos = None
            placed = []
            for k in range(len(msgs) - 1, -1, -1):
                pos = msgs[k][3] if pos is None else min(pos, msgs[k][3])
                placed.append((pos, k, msgs[k]))
            for pos, k, msg in placed:
                recvs_at[dst][pos].append((src, k, msg))

        def p2p(kind: str, msg, peer: int) -> Action:
            return Action(kind, region=msg[6], chunk=msg[7], micro=msg[8], peer=peer, tensor=msg[5],
                          step=1 if (kind == SEND and msg[4]) else 0)

        everyone = tuple(range(self.P))
        head: List[Action] = []
        tail: List[Action] = []
        if self.P > 1:
            for r, sk in self.schedule.parts[:-1]:
                if isinstance(sk, Transpose) and self.trainable[r]:
                    if sk.backward == "central":
                        head.append(Action(BROADCAST, region=r, tensor=WEIGHTS, group=everyone,
                                           root=self.forward_device(self.body, 0, 0)))
                    else:
                        tail.append(Action(ALLREDUCE, region=r, tensor=WGRAD, group=everyone))
        if self.D > 1:
            tail.append(Action(ALLREDUCE, tensor=WGRAD, group=DP_GROUP))

        programs: Dict[int, List[Action]] = {}
        for d, seq in seqs.items():
            prog = list(head)
            spilled: List[Action] = []
            for i, t in enumerate(seq):
                for src, k, msg in sorted(recvs_at[d][i], key=lambda x: (x[0], x[1])):
                    prog.append(p2p(RECV, msg, src))
                out = spilled if t.step else prog
                out.append(Action(t.kind, region=t.region, chunk=t.chunk, micro=t.micro, step=t.step))
                for msg in sends_after[d][i]:
                    out.append(p2p(SEND, msg, msg[1]))
            programs[d] = prog + tail + spilled
        return programs

    def plan(self) -> Plan:
        programs = self.lower(self.compute_order())
        return Plan(num_devices=self.P, num_micro=self.M, programs=programs, chunks=self.chunks,
                    schedule=self.schedule.to_list(), trainable=dict(self.trainable), data_parallel=self.D,
                    meta={"schedule_name": self.schedule.name(), "order": self.pipe.order,
                          "pipeline_stage": self.P, "micro_batch_num": self.M, "pp_interleave_num": self.V,
                          "owners": {r: o for r, o in self.owners.items()}})


def derive(profile: ModelProfile, schedule, P: int, M: int, V: int = 1, D: int = 1) -> Plan:
    """Derive the per-device programs of one optimizer step (see module docstring)."""
    P = _positive("parallel_config.pipeline_stage", P)
    M = _positive("parallel_config.micro_batch_num", M)
    V = _positive("parallel_config.pp_interleave_num", V)
    D = _positive("parallel_config.data_parallel", D)
    sched = parse_schedule(schedule, profile)
    return _Derivation(profile, sched, P, M, V, D).plan()


def derive_recipe(recipe, schedule=None) -> Plan:
    """Derive from a loaded recipe, with an optional schedule override (short name or list)."""
    plan = derive(recipe.profile, recipe.schedule if schedule is None else schedule, recipe.pipeline_stage,
                  recipe.micro_batch_num, recipe.pp_interleave_num, recipe.data_parallel)
    plan.meta["recipe"] = recipe.path
    return plan
