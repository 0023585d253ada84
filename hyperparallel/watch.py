"""Progress heartbeats of the ranks and the launcher's hang verdict (pure Python, no MindSpore).

Every training rank keeps one small file, ``LOG_DIR/progress_<rank>.json``, rewritten in place
before each action of its program and at each phase between programs (the step's all-reduce,
a checkpoint save): the step, the program index, the action kind, the rank(s) it waits on and
``since``, the time the rank got there, and its pid. The launcher reads these files; when no rank of
this node has moved for ``train.hang_timeout_s`` (every ``since`` older), the job is hung and
:func:`hang_verdict` names the rank that stopped. A rank whose process is stopped (``/proc`` state
``T``: SIGSTOP, Ctrl-Z; ``t``: a debugger) is the one, whatever its peers wait on. Otherwise the
wait-for chain is followed (a rank in a receive waits on its peer; in a send too: a send that does
not return is held up by its peer, as MCCL's sends to a stopped process are; a rank in a collective
waits on the members not in it) to a rank that waits on nobody (stuck in compute), or the
longest-stuck rank of a wait cycle. When the chain ends in a
wait on a rank of another node (multi-node jobs: each node's launcher sees its own ranks), the node
holding that rank judges it; this node ends the job only after ``REMOTE_FACTOR`` times the allowance
(a node that vanished with its launcher), naming the peer as not on this node.
A save or restore is never judged (a huge file may take longer than the timeout); the first step
of a run gets ``FIRST_STEP_FACTOR`` times the timeout (kernels are compiled then).
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Dict, List, Optional

SIZE = 512               # every heartbeat is one write of exactly this many bytes at offset 0
FIRST_STEP_FACTOR = 5    # the first step's allowance, in hang timeouts
REMOTE_FACTOR = 5        # ranks of this node waiting on a rank of another node: that many times the allowance
WAITS = ("SEND", "RECV", "ALLREDUCE", "BROADCAST", "ALLGATHER", "REDUCESCATTER", "reduce", "gather", "barrier")
EXEMPT = ("save", "restore")
STOPPED_STATES = {"T": "SIGSTOP?", "t": "traced: a debugger?"}   # /proc/<pid>/stat: a stopped process
_NAME = re.compile(r"progress_(\d+)\.json$")


def progress_file(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"progress_{int(rank)}.json")


class Heartbeat:
    """A rank's heartbeat file: :meth:`beat` records where the rank is now (one ``pwrite`` of a fixed-size record)."""

    def __init__(self, log_dir: str, rank: int, first_step: int = 0):
        self.rank, self.first_step = int(rank), int(first_step)
        self.fd = os.open(progress_file(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def beat(self, step: int, kind: str, index: int = -1, length: int = 0, waits=(), what: str = "") -> None:
        rec = {"rank": self.rank, "pid": os.getpid(), "step": int(step), "first_step": self.first_step,
               "index": int(index), "length": int(length), "kind": kind, "waits": sorted(int(w) for w in waits),
               "what": what[:120], "since": time.time()}
        data = json.dumps(rec).encode()
        os.pwrite(self.fd, data.ljust(SIZE)[:SIZE], 0)

    def close(self) -> None:
        os.close(self.fd)


def read_beats(log_dir: str) -> Dict[int, dict]:
    """{rank: its last heartbeat} of the progress files in ``log_dir`` (a file caught mid-write is skipped)."""
    out = {}
    try:
        names = os.listdir(log_dir)
    except OSError:
        return out
    for name in names:
        m = _NAME.match(name)
        if not m:
            continue
        try:
            with open(os.path.join(log_dir, name), "rb") as f:
                rec = json.loads(f.read(SIZE).decode().strip() or "null")
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict) and "since" in rec:
            out[int(m.group(1))] = rec
    return out


def _where(b: dict) -> str:
    at = f"program index {b['index']}/{b['length']} ({b['kind']}" if b["index"] >= 0 else f"({b['kind']}"
    if b.get("what"):
        at += f" {b['what']}"
    return at + ")"


def _waits_on(b: dict) -> str:
    w = b.get("waits") or []
    if not w:
        return "not waiting on a peer"
    return f"waiting on rank {w[0]}" if len(w) == 1 else f"waiting on ranks {', '.join(map(str, w))}"


def hang_verdict(beats: Dict[int, dict], timeout_s: float, now: Optional[float] = None,
                 ranks: Optional[List[int]] = None, states: Optional[Dict[int, str]] = None) -> Optional[str]:
    """One line naming the hung rank when no rank of ``ranks`` (default: every rank with a heartbeat) has
    moved for ``timeout_s`` (see the module docstring); None while the job makes progress. ``states``:
    {rank: its process's ``/proc/<pid>/stat`` state letter} where known (the launcher reads it by the
    heartbeat's pid)."""
    now = time.time() if now is None else now
    ranks = sorted(beats) if ranks is None else sorted(ranks)
    if not ranks or any(r not in beats for r in ranks):
        return None   # a rank not started yet (or its file not there): start-up is not judged
    bs, states = {r: beats[r] for r in ranks}, states or {}
    if any(b["kind"] in EXEMPT and states.get(r) not in STOPPED_STATES for r, b in bs.items()):
        return None   # a save in progress (a stopped process's save never ends: that is judged)
    first = any(b["step"] <= b.get("first_step", 0) for b in bs.values())
    limit = timeout_s * (FIRST_STEP_FACTOR if first else 1)
    idle = {r: now - b["since"] for r, b in bs.items()}
    if min(idle.values()) < limit:
        return None
    stopped = _stopped(bs, idle, states)
    hung = stopped[0] if stopped else _end_of_chain(bs, idle)
    b = bs[hung]
    remote = [w for w in b.get("waits") or [] if w not in bs]
    if not stopped and b["kind"] in WAITS and remote and min(idle.values()) < limit * REMOTE_FACTOR:
        return None   # the chain leaves this node: the node holding the peer judges it first
    head = f"rank {hung} hung"
    if stopped:
        head = f"rank {hung} stopped ({STOPPED_STATES[states[hung]]}), pid {b.get('pid')}"
    line = (f"{head}: no progress for {idle[hung]:.1f} s (train.hang_timeout_s {timeout_s:g}) in step "
            f"{b['step']} at {_where(b)}")
    if not stopped:
        where = ""
        if b["kind"] in WAITS and remote:
            where = f" (rank{'s' if len(remote) > 1 else ''} {', '.join(map(str, remote))} not on this node)"
        line += f", {_waits_on(b)}{where}"
    elif len(stopped) > 1:
        line += f" (stopped too: rank{'s' if len(stopped) > 2 else ''} {', '.join(map(str, stopped[1:]))})"
    waiting = [q for q in ranks if q not in stopped and q != hung and hung in (bs[q].get("waits") or [])]
    if waiting:
        q = waiting[0]
        more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
        line += f"; rank {q}{more} waits on it at {_where(bs[q])}"
    return line


def _stopped(bs: Dict[int, dict], idle: Dict[int, float], states: Dict[int, str]) -> List[int]:
    """The ranks whose process is stopped, the longest-stuck first: nothing else moves while they are."""
    return sorted((r for r in bs if states.get(r) in STOPPED_STATES), key=lambda r: (-idle[r], r))


def _end_of_chain(bs: Dict[int, dict], idle: Dict[int, float]) -> int:
    """Follow the wait-for chain from the rank stuck longest to one that waits on nobody of this node (or on a
    rank of another node); in a cycle, the cycle's longest-stuck rank."""
    r, seen = max(idle, key=lambda k: (idle[k], -k)), []
    while r not in seen:
        seen.append(r)
        nxt = [w for w in bs[r].get("waits") or [] if w in bs and w != r]
        if bs[r]["kind"] not in WAITS or not nxt:
            return r
        r = nxt[0]
    cycle = seen[seen.index(r):]
    return max(cycle, key=lambda k: (idle[k], -k))
