"""Checker: is a plan complete, dependency-ordered, FIFO-paired and deadlock-free?

Every finding names the device, the action index and what is awaited. The
deadlock test executes the programs with unit compute time and free
communication (sends buffered; receives and collectives blocking).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import List, Optional, Tuple

from ..errors import PlanError
from .execute import coll_key, execute, msg_key
from .ir import (ACT, ALL_KINDS, ALLREDUCE, B, BW, COLLECTIVE_KINDS, DP_GROUP, F, GRAD, P2P_KINDS, R, RECV, SEND,
                 TIED, W, Action, Plan, RegionList, needs_backward, prev_chunk)


class _Structure:
    """Region order and chunk counts of a plan (from its chunks, or inferred from its actions)."""

    def __init__(self, plan: Plan):
        if plan.chunks:
            self.regions = plan.regions()
            self.nchunks = Counter(c.region for c in plan.chunks)
            self.holders = {(c.region, c.index): set(c.devices) for c in plan.chunks}
        else:
            self.nchunks, self.holders = Counter(), None
            seen = defaultdict(set)
            for d in sorted(plan.programs):
                for a in plan.programs[d]:
                    if a.kind == F and a.region is not None:
                        seen[a.region].add(a.chunk)
            self.regions = RegionList(seen)
            for r, cs in seen.items():
                self.nchunks[r] = max(cs) + 1
        # recomputed chunks: their forward keeps no tape; the R before their backward records it
        self.recompute = {(c.region, c.index) for c in plan.chunks if c.recompute}
        self.trainable = dict(plan.trainable)
        weighted = {a.region for p in plan.programs.values() for a in p if a.kind in (W, BW)}
        for r in self.regions:
            if r not in self.trainable:
                self.trainable[r] = r in weighted
        self.needs_bwd = needs_backward(self.regions, self.trainable)

    def prev(self, region: str, chunk: int) -> Optional[Tuple[str, int]]:
        return prev_chunk(self.regions, self.nchunks, region, chunk)


def _where(d: int, i: int, a: Action) -> str:
    return f"device {d} action {i} ({a.label()})"


def check_chunks(plan: Plan) -> List[str]:
    """The chunk table: per region the indices 0..n-1 once each, layer ranges that are not empty and
    follow on, holders among the plan's devices."""
    errs = []
    by_region = defaultdict(list)
    for c in plan.chunks:
        by_region[c.region].append(c)
    for r, cs in by_region.items():
        idx = sorted(c.index for c in cs)
        if idx != list(range(len(cs))):
            errs.append(f"chunks of region {r!r}: indices {idx} are not 0..{len(cs) - 1} once each")
            continue
        cs = sorted(cs, key=lambda c: c.index)
        for c in cs:
            if c.stop <= c.start:
                errs.append(f"chunk {c.index} of region {r!r}: empty layer range {c.start}..{c.stop}")
            if not c.devices or any(not 0 <= x < plan.num_devices for x in c.devices):
                errs.append(f"chunk {c.index} of region {r!r}: holders {list(c.devices)} not among devices "
                            f"0..{plan.num_devices - 1}")
        for a, b in zip(cs, cs[1:]):
            if b.start != a.stop:
                errs.append(f"chunk {b.index} of region {r!r} starts at layer {b.start}, not where chunk "
                            f"{a.index} stops ({a.stop})")
    return errs


def check_structure(plan: Plan, st: _Structure) -> List[str]:
    errs = []
    P = plan.num_devices
    for d, prog in plan.programs.items():
        if not 0 <= d < P:
            errs.append(f"device {d}: program for a device outside 0..{P - 1}")
        for i, a in enumerate(prog):
            if a.kind not in ALL_KINDS:
                errs.append(f"{_where(d, i, a)}: unknown kind")
            if a.is_compute:
                if a.region not in st.nchunks or a.chunk is None or not 0 <= a.chunk < st.nchunks[a.region]:
                    errs.append(f"{_where(d, i, a)}: unknown region/chunk")
                elif st.holders is not None and d not in st.holders.get((a.region, a.chunk), ()):
                    errs.append(f"{_where(d, i, a)}: chunk is not held by device {d} "
                                f"(holders {sorted(st.holders.get((a.region, a.chunk), ()))})")
                if a.micro is None or not 0 <= a.micro < plan.num_micro:
                    errs.append(f"{_where(d, i, a)}: micro-batch outside 0..{plan.num_micro - 1}")
            if a.kind in P2P_KINDS and (a.peer is None or not 0 <= a.peer < P or a.peer == d):
                errs.append(f"{_where(d, i, a)}: peer must be another device in 0..{P - 1}")
            if a.kind in P2P_KINDS and a.tensor not in (ACT, GRAD):
                errs.append(f"{_where(d, i, a)}: tensor must be 'act' or 'grad'")
    return errs


def check_completeness(plan: Plan, st: _Structure) -> List[str]:
    """Each forward once; one weight-grad per trainable task; an input-grad only where needed."""
    count = Counter()
    for d, prog in plan.programs.items():
        for a in prog:
            if a.is_compute:
                count[(a.kind, a.region, a.chunk, a.micro)] += 1
    errs = []
    for r in st.regions:
        for c in range(st.nchunks[r]):
            for m in range(plan.num_micro):
                f = count[(F, r, c, m)]
                if f != 1:
                    errs.append(f"F {r} c{c} m{m} runs {f} times, expected once")
                bw, b, w = count[(BW, r, c, m)], count[(B, r, c, m)], count[(W, r, c, m)]
                if st.trainable[r]:
                    if bw + w != 1 or b != w:
                        errs.append(f"backward of {r} c{c} m{m}: {bw} BW, {b} B, {w} W; expected one BW, "
                                    "or one B and one W (trainable)")
                elif st.needs_bwd[r]:
                    if b != 1 or bw or w:
                        errs.append(f"backward of {r} c{c} m{m}: {bw} BW, {b} B, {w} W; expected one B "
                                    "(frozen, input grad only)")
                elif bw or b or w or count[(R, r, c, m)]:
                    errs.append(f"backward of {r} c{c} m{m} scheduled, but {r} and everything before it is frozen")
                if count[(R, r, c, m)] > 1:
                    errs.append(f"R {r} c{c} m{m} runs {count[(R, r, c, m)]} times, expected at most once")
                elif (r, c) in st.recompute and st.needs_bwd[r] and count[(R, r, c, m)] != 1:
                    errs.append(f"R {r} c{c} m{m} runs {count[(R, r, c, m)]} times; the chunk is recomputed, "
                                "expected once before its backward")
    return errs


def check_dependencies(plan: Plan, st: _Structure) -> List[str]:
    """Walk each program: every input is computed or received earlier on the same device."""
    last = (st.regions[-1], st.nchunks[st.regions[-1]] - 1) if st.regions else None
    errs = []
    for d, prog in sorted(plan.programs.items()):
        # next-step data (spilled forwards, their receives) was produced or received by the previous step
        have = {(ACT, a.region, a.chunk, a.micro, 0) for a in prog if a.kind in (F, RECV) and a.step}
        for i, a in enumerate(prog):
            key = (a.region, a.chunk, a.micro)
            need = []
            if a.kind in (F, R):
                prev = st.prev(a.region, a.chunk)
                if prev is not None:
                    src = ("ract" if a.kind == R else "act",) + prev + (a.micro, a.step)
                    if a.kind == R and src not in have:
                        src = ("act",) + prev + (a.micro, 0)
                    need.append(src)
            elif a.kind in (B, BW):
                need.append(("stash",) + key)
                if (a.region, a.chunk) != last:
                    need.append((GRAD,) + key)
            elif a.kind == W:
                need.append(("bdone",) + key)
            elif a.kind == SEND:
                need.append((a.tensor,) + key + ((a.step,) if a.tensor == ACT else ()))
            missing = [n for n in need if n not in have]
            if missing:
                what = missing[0]
                errs.append(f"{_where(d, i, a)}: needs {what[0]} of {what[1]} c{what[2]} m{what[3]}, which is "
                            f"neither computed nor received earlier on device {d}")
                if len(errs) > 20:
                    return errs
            if a.kind == F:
                have.add((ACT,) + key + (a.step,))
                if (a.region, a.chunk) not in st.recompute:   # a recomputed chunk's forward keeps its input only
                    have.add(("stash",) + key)
            elif a.kind == R:
                have.add(("ract",) + key + (0,))
                have.add(("stash",) + key)
            elif a.kind == RECV:
                have.add((a.tensor,) + key + ((a.step,) if a.tensor == ACT else ()))
            elif a.kind in (B, BW):
                have.add(("bdone",) + key)
                prev = st.prev(a.region, a.chunk)
                if prev is not None:
                    have.add((GRAD,) + prev + (a.micro,))
    return errs


def _channels(plan: Plan):
    """Per ordered pair: the sender's and the receiver's message sequences (collectives as markers)."""
    out, inn = defaultdict(list), defaultdict(list)
    ncoll = Counter()
    for d, prog in sorted(plan.programs.items()):
        for i, a in enumerate(prog):
            if a.kind == SEND:
                out[(d, a.peer)].append((msg_key(a), i))
            elif a.kind == RECV:
                inn[(a.peer, d)].append((msg_key(a), i))
            elif a.kind in COLLECTIVE_KINDS and isinstance(a.group, tuple):
                k = ncoll[(d, coll_key(a))]
                ncoll[(d, coll_key(a))] += 1
                for m in a.group:
                    if m != d:
                        out[(d, m)].append((("collective",) + coll_key(a) + (k,), i))
                        inn[(m, d)].append((("collective",) + coll_key(a) + (k,), i))
    return out, inn


def check_fifo(plan: Plan) -> List[str]:
    out, inn = _channels(plan)
    errs = []
    for pair in sorted(set(out) | set(inn)):
        a, b = pair
        sent, got = out.get(pair, []), inn.get(pair, [])
        sent_keys, got_keys = {x[0] for x in sent}, {x[0] for x in got}
        for k in range(max(len(sent), len(got))):
            s = sent[k] if k < len(sent) else None
            g = got[k] if k < len(got) else None
            if s is not None and g is not None and s[0] == g[0]:
                continue
            if g is not None and g[0] not in sent_keys:
                errs.append(f"device {b} action {g[1]} ({plan.programs[b][g[1]].label()}): awaits {g[0]} from "
                            f"device {a}, which never sends it")
            elif s is not None and s[0] not in got_keys:
                errs.append(f"device {a} action {s[1]} ({plan.programs[a][s[1]].label()}): sends {s[0]} to "
                            f"device {b}, which never receives it")
            else:
                errs.append(f"device {b} action {g[1]} ({plan.programs[b][g[1]].label()}): FIFO order broken on "
                            f"channel {a}->{b}: awaits {g[0]} as message #{k}, but device {a} action {s[1]} "
                            f"({plan.programs[a][s[1]].label()}) sends {s[0]} in that place")
            break
    return errs


def check_collectives(plan: Plan) -> List[str]:
    """Each group's collectives appear in the same order on every member."""
    seqs = defaultdict(lambda: defaultdict(list))
    errs = []
    for d, prog in sorted(plan.programs.items()):
        for i, a in enumerate(prog):
            if a.kind in COLLECTIVE_KINDS:
                if a.group == DP_GROUP:
                    continue
                if not isinstance(a.group, tuple) or d not in a.group:
                    errs.append(f"{_where(d, i, a)}: device {d} is not a member of group {a.group}")
                    continue
                seqs[a.group][d].append((coll_key(a), i))
    for group, per in seqs.items():
        for m in group:
            if m not in per:
                errs.append(f"device {m}: never joins the collectives of group {list(group)}")
        ref_dev = min(per)
        ref = per[ref_dev]
        for m, seq in per.items():
            for k in range(max(len(seq), len(ref))):
                x = seq[k] if k < len(seq) else None
                y = ref[k] if k < len(ref) else None
                if x is None or y is None or x[0] != y[0]:
                    at = f"device {m} action {x[1]}" if x else f"device {m} (end of program)"
                    errs.append(f"{at}: collective #{k} of group {list(group)} differs from device {ref_dev}'s")
                    break
    return errs


def check_tied(plan: Plan, st: _Structure) -> List[str]:
    """Tied weights: the plan's ``tied`` entries name held chunks, and each one of a trained region with copies
    on two or more devices is summed by exactly one ALLREDUCE ``tied`` over exactly those devices, after every
    weight-grad of a holding chunk on that device (else an optimizer would step on a part of the gradient);
    no other ALLREDUCE ``tied`` is in a program."""
    errs, want = [], {}
    for i, t in enumerate(plan.tied):
        holders = set()
        for c in t.chunks:
            if st.holders is not None and (t.region, c) not in st.holders:
                errs.append(f"tied[{i}] ({t.name}): chunk {c} of region {t.region!r} does not exist")
                continue
            holders |= st.holders[(t.region, c)] if st.holders is not None else set()
        if st.holders is not None and holders != set(t.devices):
            errs.append(f"tied[{i}] ({t.name}): devices {list(t.devices)} but its chunks are held by {sorted(holders)}")
        if st.trainable.get(t.region) and len(set(t.chunks)) > 1 and len(t.devices) > 1:
            want[(t.region, tuple(t.devices))] = (i, t)
    for d, prog in sorted(plan.programs.items()):
        seen = Counter()
        for i, a in enumerate(prog):
            if a.kind == ALLREDUCE and a.tensor == TIED:
                key = (a.region, a.group if isinstance(a.group, tuple) else None)
                if key not in want:
                    errs.append(f"{_where(d, i, a)}: no tied weight of the plan has copies on exactly these devices")
                    continue
                seen[key] += 1
                _, t = want[key]
                late = [j for j in range(i + 1, len(prog)) if prog[j].kind in (W, BW) and prog[j].region == t.region
                        and prog[j].chunk in t.chunks]
                if late:
                    errs.append(f"{_where(d, i, a)}: before {prog[late[0]].label()} (action {late[0]}), whose "
                                f"weight grads of {t.name} it must sum")
        for key, (k, t) in want.items():
            if d in t.devices and seen[key] != 1:
                errs.append(f"device {d}: {seen[key]} ALLREDUCE tied of tied[{k}] ({t.name}) over devices "
                            f"{list(t.devices)}, expected exactly one")
    return errs


def check_deadlock(plan: Plan) -> List[str]:
    try:
        execute(plan, lambda a: 1.0, lambda a: 0.0)
    except PlanError as e:
        return [str(e)]
    return []


def check(plan: Plan) -> List[str]:
    """All findings, most basic first; an empty list means the plan is valid."""
    errs = check_chunks(plan)
    if errs:
        return errs
    st = _Structure(plan)
    for stage in (lambda: check_structure(plan, st), lambda: check_completeness(plan, st),
                  lambda: check_dependencies(plan, st), lambda: check_fifo(plan),
                  lambda: check_collectives(plan), lambda: check_tied(plan, st), lambda: check_deadlock(plan)):
        errs = stage()
        if errs:
            return errs
    return []


def assert_valid(plan: Plan) -> Plan:
    errs = check(plan)
    if errs:
        raise PlanError(errs[0] + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""))
    return plan
