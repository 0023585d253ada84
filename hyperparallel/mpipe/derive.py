"""Derivation: (profile, schedule, P, M, V, D) -> Plan. Pure functions, no I/O.

1. placement: every F/B/W/BW/R task gets a device (cut + skeleton rules);
2. compute order per device: the body's order rule gives the main sequence,
   upstream regions are layered in as prefix (before the body), inline (next to
   the consumer on the same device) or suffix (after the body);
3. recompute (:mod:`.recompute`): chunks with recomputed layers split at their inner boundary, every
   task of them expanded in place (an R before the first backward of a recomputed chunk);
4. lowering (:mod:`.lowering`, a list of named passes): a SEND right after the producer
   and a RECV before the consumer for every cross-device edge, receives ordered so that
   each device pair sees one FIFO message sequence, and the collectives of replicated regions.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import bounds, lowering, orders
from . import recompute as rc
from .cut import cut
from .execute import execute
from ..errors import SpecError, whole
from .ir import (ALLREDUCE, B, BW, F, R, TIED, W, Action, Plan, RegionList, Tied, needs_backward, next_chunk,
                 prev_chunk)
from .owners import owner_map
from .profile import ModelProfile, task_ms
from .schedule import Pipe, Place, Schedule, Transpose, parse_schedule


class Task(NamedTuple):
    kind: str
    region: str
    chunk: int
    micro: int
    step: int = 0




class _Derivation:
    """Holds the intermediate state of one derivation; ``plan()`` returns the result."""

    def __init__(self, profile: ModelProfile, schedule: Schedule, P: int, M: int, V: int, D: int, zero: int = 0):
        self.profile, self.schedule, self.P, self.M, self.V, self.D = profile, schedule, P, M, V, D
        self.zero = zero
        self.regions = RegionList(r for r, _ in schedule.parts)
        self.ridx = {r: i for i, r in enumerate(self.regions)}
        self.body, self.pipe = schedule.body
        orders.validate(self.pipe.order, P, V, M)
        self.chunks = cut(profile, schedule, P, V)
        self.nchunks = defaultdict(int)
        for c in self.chunks:
            self.nchunks[c.region] += 1
        self.trainable = {r: profile.region(r).trainable for r in self.regions}
        self.needs_bwd = needs_backward(self.regions, self.trainable)
        self._validate_upstream()
        self.main = self._body_sequences()
        self.pairs = {d: orders.overlap_pairs(self.pipe.order, P, V, M, d) for d in range(P)}
        self._timing = None
        self.tied = self._tied(self.chunks)
        self.owners = self._owners()
        # the plan's chunks: the pipeline chunks, those with recomputed layers split (:mod:`.recompute`)
        self.plan_chunks, self.parts = rc.split(self.chunks, self._recompute_counts())
        self.split = self.plan_chunks != self.chunks

    def _recompute_counts(self) -> Dict[Tuple[str, int], int]:
        """Recomputed layers of every pipeline chunk; a recompute of a region without backward (it and every
        region before it frozen) or of a central backward (which recomputes already) is refused."""
        out = {}
        for r, sk in self.schedule.parts:
            if not rc.is_on(sk.recompute):
                continue
            field = f"schedule.{r}.recompute"
            if not self.needs_bwd[r]:
                raise SpecError(field, f"{r!r} has no backward (it and every region before it are frozen): there "
                                       f"is nothing to recompute; allowed: none")
            if isinstance(sk, Transpose) and sk.backward == "central":
                raise SpecError(field, f"backward=central recomputes {r!r} already (from its shipped input); "
                                       f"allowed: none")
            mine = sorted((c for c in self.chunks if c.region == r), key=lambda c: c.index)
            for c, k in zip(mine, rc.per_chunk(field, sk.recompute, [c.layers for c in mine])):
                out[(r, c.index)] = k
        return out

    # -- validation and placement -------------------------------------------------
    def _validate_upstream(self) -> None:
        for i, (r, sk) in enumerate(self.schedule.parts[:-1]):
            if not isinstance(sk, Transpose):
                continue
            if sk.spill == "next_step" and self.needs_bwd[r]:
                raise SpecError(f"schedule.{r}.spill",
                                "next_step is exact only for a frozen encoder; set the region (and those before "
                                "it) trainable: false, or use spill=none")
            if sk.spill == "next_step":
                for u, usk in self.schedule.parts[:i]:
                    if not (isinstance(usk, Transpose) and usk.spill == "next_step"):
                        raise SpecError(f"schedule.{r}.spill",
                                        f"next_step needs every region before it transposed with spill=next_step "
                                        f"({u!r} is not); allowed: none")
            if sk.optimizer == "sharded":
                if not self.trainable[r]:
                    raise SpecError(f"schedule.{r}.optimizer", f"sharded needs a trainable encoder: {r!r} is frozen "
                                    "(no gradients, no optimizer state to shard); allowed: replicated")
                if sk.backward == "central":
                    raise SpecError(f"schedule.{r}.optimizer", "sharded needs backward=owner (central keeps the "
                                    "encoder's optimizer state on one device already); allowed: replicated")
                if self.zero:
                    raise SpecError(f"schedule.{r}.optimizer", f"sharded shards {r!r} over its pipeline replicas; "
                                    f"ZeRO (train.zero {self.zero}) shards every region over the data-parallel "
                                    "replicas: give one of them (optimizer=replicated, or train.zero: 0)")
            if sk.backward == "central" and self.needs_bwd[r]:
                for u, usk in self.schedule.parts[:i]:
                    if not (isinstance(usk, Transpose) and usk.backward == "central"):
                        raise SpecError(f"schedule.{r}.backward",
                                        f"central needs every region before it transposed with backward=central "
                                        f"({u!r} is not); allowed: owner")

    def _tied(self, chunks) -> List[Tied]:
        """The profile's tied weights placed: the chunks holding a copy (the chunk of each listed layer) and
        their devices. A tied weight of a region this schedule does not run is refused, naming it."""
        out = []
        for i, t in enumerate(self.profile.tied):
            if t.region not in self.ridx:
                raise SpecError(f"mpipe.profile.tied[{i}].region", f"{t.region!r} is not a region of the schedule; "
                                                                   f"allowed: {', '.join(self.regions)}")
            held = [c for c in chunks if c.region == t.region and any(c.start <= x < c.stop for x in t.layers)]
            out.append(Tied(t.name, t.region, tuple(c.index for c in held),
                            tuple(sorted({d for c in held for d in c.devices}))))
        return out

    def tied_reduces(self, tied: List[Tied]) -> List[Action]:
        """One ALLREDUCE of tensor ``tied`` per tied weight of a trained region whose copies sit on two or
        more devices (two chunks on one device are one parameter: nothing to reduce)."""
        return [Action(ALLREDUCE, region=t.region, tensor=TIED, group=t.devices) for t in tied
                if self.trainable[t.region] and len(t.chunks) > 1 and len(t.devices) > 1]

    def _transposed(self) -> List[Tuple[str, Transpose]]:
        return [(r, sk) for r, sk in self.schedule.parts[:-1] if isinstance(sk, Transpose)]

    def _region_ms(self, region: str, kinds: Tuple[str, ...]) -> float:
        r = self.profile.region(region)
        return sum(task_ms(r, k, r.layers, head=True) for k in kinds)

    def _owners(self) -> Dict[str, List[int]]:
        """Owner map per transposed region; ``balanced`` reads the body's idle times (one estimate)."""
        ups = self._transposed()
        if not ups:
            return {}
        out = {}
        for r, sk in ups:
            if sk.owners != "balanced" or self.P == 1:
                out[r] = owner_map(sk.owners, self.P, self.M)
                continue
            spill = sk.spill == "next_step"
            same = [u for u, usk in ups if (usk.spill == "next_step") == spill]
            enc_f = sum(self._region_ms(u, (F,)) for u in same)
            enc_b = 0.0
            for u, usk in ups:
                if (usk.spill == "next_step") == spill and self.needs_bwd[u] and usk.backward == "owner":
                    enc_b += self._region_ms(u, (self._bwd_kind(u),))
            t = self.body_timing()
            if spill:
                slots = [self._gap_slots(d, enc_f) for d in range(self.P)]
                out[r] = owner_map("balanced", self.P, self.M, encoder_ms=enc_f, end_slack=self._spill_room(),
                                   gap_slots=[sum(k for _, k in s) for s in slots], spill=True)
            else:
                out[r] = owner_map("balanced", self.P, self.M, encoder_ms=enc_f, encoder_bwd_ms=enc_b,
                                   start_slack=t.start_slack, end_slack=t.end_slack)
        return out

    # -- body timing estimate (free communication), read by balanced owners and spill placement ----
    def body_timing(self) -> "BodyTiming":
        """Start/end of every body task with the profile's compute times and free communication.

        A static estimate computed once per derivation, by the same executor as the checker and
        the cost model, on the body's own lowered programs: it gives each device's idle gaps
        (before which body task, how long), its start slack (idle before its first task) and its
        end slack (idle after its last task until the body's makespan).
        """
        if self._timing is not None:
            return self._timing
        r = self.profile.region(self.body)
        layers = {c.index: c.layers for c in self.chunks if c.region == self.body}
        last = max(c.stop for c in self.chunks if c.region == self.body)
        head = {c.index: c.stop == last for c in self.chunks if c.region == self.body}
        body = Plan(num_devices=self.P, num_micro=self.M, programs=self.lower(self.main), chunks=self.chunks)
        ex = execute(body, lambda a: task_ms(r, a.kind, layers[a.chunk], head[a.chunk]), lambda a: 0.0)
        tasks = {d: [t for t in ex.timeline[d] if t.lane == "compute"] for d in range(self.P)}
        span = max([ts[-1].end for ts in tasks.values() if ts] + [0.0])
        gaps = []
        for d in range(self.P):
            g, prev = [], 0.0
            for i, t in enumerate(tasks[d]):
                if t.start > prev + 1e-9:
                    g.append((i, t.start - prev))
                prev = t.end
            gaps.append(g)
        self._timing = BodyTiming(span, [tasks[d][0].start if tasks[d] else span for d in range(self.P)],
                                  [span - (tasks[d][-1].end if tasks[d] else 0.0) for d in range(self.P)], gaps)
        return self._timing

    def _gap_slots(self, d: int, unit_ms: float) -> List[Tuple[int, int]]:
        """(body index, how many spilled encoder forwards of ``unit_ms`` fit in the idle gap before it).

        Only gaps inside the body order count: the idle before the first body task joins the
        previous step's cooldown idle (see :meth:`_spill_room`), where the suffix runs.
        """
        if unit_ms <= 0:
            return []
        out = []
        for i, gap in self.body_timing().gaps[d]:
            # at most M units exist; the cap also keeps a near-zero unit (gap / unit = inf) an integer
            k = int(min(gap / unit_ms + 1e-9, self.M))
            if k and i > 0:
                out.append((i, k))
        return out

    def _spill_room(self) -> List[float]:
        """Idle from a device's last body task to its first body task of the next step (steady state)."""
        t = self.body_timing()
        return [e + s for e, s in zip(t.end_slack, t.start_slack)]

    def forward_device(self, region: str, chunk: int, m: int) -> int:
        sk = self.schedule.skeleton(region)
        if isinstance(sk, Pipe):
            return orders.device_of(sk.order, chunk, self.P)
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
    def _body_sequences(self) -> Dict[int, List[Task]]:
        body_needs_bwd, body_trainable = self.needs_bwd[self.body], self.trainable[self.body]
        main: Dict[int, List[Task]] = {}
        for d in range(self.P):
            seq = []
            for kind, c, m in orders.device_order(self.pipe.order, self.P, self.V, self.M, d, self._chunk_costs()):
                if kind != F and not body_needs_bwd:
                    continue
                if kind == W and not body_trainable:
                    continue
                if kind == BW and not body_trainable:
                    kind = B
                seq.append(Task(kind, self.body, c, m))
            main[d] = seq
        return main

    def _chunk_costs(self) -> Tuple[float, float, float]:
        """Mean per-chunk (F, B, W) times of the body: the list-scheduled orders play with these."""
        n = self.P * self.V
        return tuple(self._region_ms(self.body, (k,)) / n for k in (F, B, W))

    def compute_order(self) -> Dict[int, List[Task]]:
        split = orders.ORDERS[self.pipe.order].split
        body_trainable = self.trainable[self.body]
        # the body sequences as linked lists (insert next to a task in O(1)); every placed task's
        # home (device, sequence) in one map, so finding a consumer is O(1) too: no step of the
        # layering grows with the square of M or of the region count
        main: Dict[int, _Linked] = {d: _Linked(seq) for d, seq in self.main.items()}
        spilled: Dict[int, List[Task]] = defaultdict(list)
        prefix: Dict[int, List[Task]] = defaultdict(list)
        suffix: Dict[int, List[Task]] = defaultdict(list)
        home: Dict[Task, Tuple[int, str]] = {t: (d, "main") for d, seq in self.main.items() for t in seq}

        def where(task: Task, d: int) -> Tuple[int, str]:
            hit = home.get(task._replace(step=0))
            if hit is None or hit[0] != d:
                raise AssertionError(f"task {task} not placed on device {d}")
            return hit

        def put(d: int, name: str, tasks: List[Task]) -> None:
            for t in tasks:
                home[t._replace(step=0)] = (d, name)

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
                    if clist == "main":
                        main[d].insert_before(Task(F, nxt, 0, m), fwd)
                    else:
                        (prefix, suffix, spilled)[("prefix", "suffix", "spilled").index(clist)][d].append(fwd)
                    put(d, clist, [fwd])
                elif step:
                    spilled[d].append(fwd)
                    put(d, "spilled", [fwd])
                else:
                    prefix[d].append(fwd)
                    put(d, "prefix", [fwd])
                if not self.needs_bwd[r]:
                    continue
                bwd = [Task(self._bwd_kind(r), r, 0, m)]
                if isinstance(sk, Transpose) and sk.backward == "central":
                    d = self.forward_device(self.body, 0, m)
                    bwd = [Task(R, r, 0, m)] + bwd
                gp = grad_producer(r, m)
                gd, glist = where(gp, self.backward_device(nxt, m))
                if not (isinstance(sk, Transpose) and sk.backward == "owner") and gd == d and glist == "main":
                    main[d].insert_after(gp, bwd)
                    put(d, "main", bwd)
                else:
                    suffix[d].extend(bwd)
                    put(d, "suffix", bwd)

        main = {d: seq.to_list() for d, seq in main.items()}
        self._place_spilled(main, suffix, spilled)
        kind_rank = {R: 0, F: 1, B: 2, BW: 2, W: 3}
        out = {}
        for d in range(self.P):
            pre = sorted(prefix[d], key=lambda t: (t.step, t.micro, self.ridx[t.region]))
            suf = sorted(suffix[d], key=lambda t: (t.step, t.micro,
                                                   self.ridx[t.region] if t.step else -self.ridx[t.region],
                                                   kind_rank[t.kind]))
            out[d] = pre + main[d] + suf
        return out

    def _place_spilled(self, main, suffix, spilled) -> None:
        """Next-step spill: a device's spilled encoder forwards go where it would otherwise wait.

        Static rule from the body timing estimate: the forwards of one micro-batch (every
        spilled region, data-flow order) form a unit of ``E`` ms; as many units as fit go into
        each idle gap of the device's body order (before the task that ends the gap, earliest
        gap first, lowest micro-batch first), the rest into the suffix (the device's cooldown
        idle and the next step's start). Device 0 in 1F1B has no cooldown idle but waits
        (P-1)(b+w) before its first backward: its spilled forwards go there.
        """
        if not spilled:
            return
        unit = sum(self._region_ms(r, (F,)) for r, sk in self._transposed() if sk.spill == "next_step")
        for d, tasks in spilled.items():
            tasks.sort(key=lambda t: (t.micro, self.ridx[t.region]))
            units: List[List[Task]] = []
            for t in tasks:
                if units and units[-1][0].micro == t.micro:
                    units[-1].append(t)
                else:
                    units.append([t])
            # a unit whose input comes from another device (an upstream spilled region with other
            # owners) waits for that device's next-step work: it runs in the suffix, never in a gap
            # (a gap would block this device's body on the other's trailing work)
            local = [u for u in units if all(self._spill_input_device(t) in (None, d) for t in u)]
            rest = [u for u in units if u not in local]
            at = 0
            inserts = []
            for i, k in self._gap_slots(d, unit) if self.P > 1 else []:
                take = local[at:at + k]
                at += len(take)
                if take:
                    inserts.append((i, [t for u in take for t in u]))
                if at >= len(local):
                    break
            if inserts:   # one pass (a slice insert per gap would grow with the square of M)
                out, prev = [], 0
                for i, ts in inserts:
                    out.extend(main[d][prev:i])
                    out.extend(ts)
                    prev = i
                out.extend(main[d][prev:])
                main[d] = out
            suffix[d].extend(t for u in local[at:] + rest for t in u)

    def _spill_input_device(self, t: Task) -> Optional[int]:
        """Device of the forward that feeds spilled task ``t`` (None for the model's first region)."""
        i = self.ridx[t.region]
        return None if i == 0 else self.forward_device(self.regions[i - 1], 0, t.micro)

    # -- lowering -----------------------------------------------------------------------
    def lowering_facts(self, final: bool = False) -> lowering.Facts:
        """What the lowering passes read of this derivation: of the pipeline chunks, or (``final``) of the
        plan's chunks (recomputed parts split off)."""
        chunks = self.plan_chunks if final else self.chunks
        n = defaultdict(int)
        for c in chunks:
            n[c.region] += 1
        pairs = ({d: rc.expand_pairs(p, self.body, self.parts) for d, p in self.pairs.items()} if final and self.split
                 else self.pairs)
        return lowering.Facts(P=self.P, D=self.D, upstream=tuple(self.schedule.parts[:-1]), trainable=self.trainable,
                              body=self.body, body_root=self.forward_device(self.body, 0, 0),
                              tied_reduces=tuple(self.tied_reduces(self._tied(chunks))), pairs=pairs,
                              prev=lambda r, c: prev_chunk(self.regions, n, r, c),
                              next=lambda r, c: next_chunk(self.regions, n, r, c), zero=self.zero)

    def lower(self, seqs: Dict[int, List[Task]], final: bool = False) -> Dict[int, List[Action]]:
        """Per-device programs of the compute sequences ``seqs``: the passes of :mod:`.lowering`."""
        return lowering.lower(self.lowering_facts(final), seqs)

    def plan(self) -> Plan:
        seqs = self.compute_order()
        if any(c.recompute for c in self.plan_chunks):
            seqs = rc.expand(seqs, self.parts)
        programs = self.lower(seqs, final=True)
        return Plan(num_devices=self.P, num_micro=self.M, programs=programs, chunks=self.plan_chunks,
                    schedule=self.schedule.to_list(), trainable=dict(self.trainable), data_parallel=self.D,
                    meta={"schedule_name": self.schedule.name(), "order": self.pipe.order,
                          "pipeline_stage": self.P, "micro_batch_num": self.M, "pp_interleave_num": self.V,
                          "owners": {r: o for r, o in self.owners.items()}},
                    tied=self._tied(self.plan_chunks))


class _Linked:
    """A sequence of distinct tasks as a doubly linked list: insert before or after a task in O(1)."""

    _HEAD = ("<head>",)
    _TAIL = ("<tail>",)

    def __init__(self, items: List[Task]):
        self.nxt = {self._HEAD: self._TAIL}
        self.prv = {self._TAIL: self._HEAD}
        last = self._HEAD
        for t in items:
            self._link(last, t)
            last = t

    def _link(self, after, t) -> None:
        if t in self.nxt:
            raise AssertionError(f"task {t} placed twice")
        n = self.nxt[after]
        self.nxt[after], self.nxt[t] = t, n
        self.prv[n], self.prv[t] = t, after

    def insert_before(self, anchor: Task, t: Task) -> None:
        self._link(self.prv[anchor], t)

    def insert_after(self, anchor: Task, ts: List[Task]) -> None:
        for t in ts:
            self._link(anchor, t)
            anchor = t

    def to_list(self) -> List[Task]:
        out, t = [], self.nxt[self._HEAD]
        while t is not self._TAIL:
            out.append(t)
            t = self.nxt[t]
        return out


class BodyTiming(NamedTuple):
    span: float                          # makespan of the body alone
    start_slack: List[float]             # idle before each device's first body task
    end_slack: List[float]               # idle after each device's last body task
    gaps: List[List[Tuple[int, float]]]  # per device: (body index, idle before that task)


#: ZeRO levels over the data-parallel group: 0 none, 1 optimizer state sharded, 2 gradients too
ZERO_LEVELS = (0, 1, 2)


def check_zero(zero, D: int, key: str = "train.zero") -> int:
    """The ZeRO level ``zero`` (given by ``key``), checked: one of :data:`ZERO_LEVELS`, and above 0 only with
    data-parallel replicas to shard over (``D`` > 1)."""
    if isinstance(zero, bool) or zero not in ZERO_LEVELS:
        raise SpecError(key, f"{zero!r} unknown; allowed: {', '.join(map(str, ZERO_LEVELS))}")
    if zero and D < 2:
        off = "false" if key.endswith("optimizer_shard") else "0"
        raise SpecError(key, f"ZeRO {zero} shards over the data-parallel replicas, but parallel_config.data_parallel "
                             f"is {D} (a single replica); allowed with data_parallel 1: {off} (or raise "
                             "data_parallel to 2 or more)")
    return int(zero)


def derive(profile: ModelProfile, schedule, P: int, M: int, V: int = 1, D: int = 1, zero: int = 0) -> Plan:
    """Derive the per-device programs of one optimizer step (see module docstring). ``zero``: ZeRO over the
    ``D`` data-parallel replicas (:data:`ZERO_LEVELS`)."""
    P = whole("parallel_config.pipeline_stage", P)
    M = whole("parallel_config.micro_batch_num", M)
    V = whole("parallel_config.pp_interleave_num", V)
    D = whole("parallel_config.data_parallel", D)
    for field, value, bound in (("parallel_config.pipeline_stage", P, bounds.MAX_PIPELINE_STAGE),
                                ("parallel_config.micro_batch_num", M, bounds.MAX_MICRO_BATCH),
                                ("parallel_config.pp_interleave_num", V, bounds.MAX_INTERLEAVE),
                                ("parallel_config.data_parallel", D, bounds.MAX_DATA_PARALLEL)):
        bounds.at_most(field, value, bound)
    bounds.check_plan_size(P, V, M, len(profile.regions))
    zero = check_zero(zero, D)
    sched = parse_schedule(schedule, profile, V=V)
    return _Derivation(profile, sched, P, M, V, D, zero).plan()
