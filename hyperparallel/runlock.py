"""One run at a time per directory: ``DIR/.hyperparallel.lock`` names the run that holds it.

``hyperparallel train`` holds its run directory and its save directory while it runs, so a second run
started into either (another terminal, a job resubmitted by a scheduler) is refused before launch,
naming the holder (pid, host, start time, command), instead of interleaving its metrics and checkpoints
with the first one's. The lock file is created with ``O_CREAT | O_EXCL`` (atomic: one creator wins).

A lock is stale when its holder is gone: on this host, its pid is not running (``os.kill(pid, 0)``) or is
another process now (a different start time in ``/proc``, or this very process, which a restarted
container may be, not holding it). A stale lock is taken over with a one-line note. A lock held from
another host is refused: only that host can tell whether its holder still runs (the message says which
file to remove if not).
The nodes of one multi-node job share the directories, so each node has a lock of its own
(:func:`lock_name`). Released (removed, when still ours) as the run ends: normally, on an error, or on
SIGTERM/SIGHUP outside a launch (inside one the launcher handles signals and returns normally).
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import sys
import time
import uuid
from typing import Iterator, List, Optional, Sequence, Tuple

from .errors import SpecError

LOCK = ".hyperparallel.lock"
_HELD = set()   # the tokens of the locks this process holds


def lock_name(node: int = 0) -> str:
    """The lock file's name for a job's node ``node`` (node 0: ``.hyperparallel.lock``)."""
    return LOCK if not node else f".hyperparallel.node{int(node)}.lock"


def _pid_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def _command() -> str:
    """This process's command line (``python -m hyperparallel``'s ``.../__main__.py``: ``hyperparallel``)."""
    argv = list(sys.argv) or ["?"]
    if os.path.basename(argv[0]) == "__main__.py":
        argv[0] = os.path.basename(os.path.dirname(os.path.abspath(argv[0])))
    return shlex.join(argv)


def _record() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_start": _pid_start(os.getpid()),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": _command()[:500],
            "token": uuid.uuid4().hex}


def _read(path: str) -> Optional[dict]:
    """The holder's record; {} when the file is there but holds no record (yet); None when it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def holder_running(rec: dict) -> Optional[bool]:
    """Whether the lock's holder runs: True/False on this host, None on another (cannot tell)."""
    if rec.get("host") != socket.gethostname():
        return None
    try:
        pid = int(rec.get("pid"))
    except (TypeError, ValueError):
        return False
    if pid == os.getpid():   # ours, or a pid this process reuses (a restarted container)
        return rec.get("token") in _HELD
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # running, as another user
        pass
    start = _pid_start(pid)
    return not (rec.get("pid_start") and start and start != rec["pid_start"])


def describe(rec: dict) -> str:
    return (f"pid {rec.get('pid')} on {rec.get('host')}, started {rec.get('started')}: "
            f"{rec.get('command') or '(command not recorded)'}")


class DirLock:
    """The lock of one directory, named in messages by the flag that gave it (``--run-dir``)."""

    def __init__(self, flag: str, directory: str, node: int = 0):
        self.flag, self.directory = flag, directory
        self.path = os.path.join(directory, lock_name(node))
        self.token: Optional[str] = None

    def acquire(self, wait_s: float = 2.0) -> str:
        """Take the lock; returns a note ('' or the stale lock taken over). SpecError naming the holder
        when another run holds it. A lock file without a record (its creator between create and write)
        is waited for ``wait_s``, then counted stale."""
        rec = _record()
        note, deadline = "", time.monotonic() + wait_s
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = _read(self.path)
                if held is None:
                    continue   # released meanwhile: try again
                if not held and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                running = holder_running(held) if held else False
                if running is None:
                    raise SpecError(self.flag, f"{self.directory} is in use by another run ({describe(held)}); this "
                                               f"host cannot tell whether it still runs: if it does not, remove "
                                               f"{self.path}") from None
                if running:
                    raise SpecError(self.flag, f"{self.directory} is in use by another run ({describe(held)}); wait "
                                               f"for it to end or give another {self.flag}") from None
                note = (f"note: {self.flag}: took over the stale lock {self.path} ("
                        + (f"pid {held.get('pid')} on {held.get('host')}, started {held.get('started')}, is no "
                           f"longer running)" if held else "no holder recorded)"))
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(rec, f)
            self.token = rec["token"]
            _HELD.add(self.token)
            return note

    def release(self) -> None:
        """Remove the lock file if this run still holds it."""
        if self.token and (_read(self.path) or {}).get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
        _HELD.discard(self.token)
        self.token = None


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def holding(dirs: Sequence[Tuple[str, str]], node: int = 0, echo=print) -> Iterator[List[DirLock]]:
    """Hold the locks of ``dirs`` ([(flag, directory)], one lock per distinct directory) while the
    block runs; SpecError (nothing held) when another run holds one. SIGTERM/SIGHUP left at their default
    end the block with exit status 128+N, so the locks are released."""
    locks, seen = [], set()
    for flag, d in dirs:
        if d and os.path.realpath(d) not in seen:
            seen.add(os.path.realpath(d))
            locks.append(DirLock(flag, d, node))
    old = {}
    try:
        for lk in locks:
            note = lk.acquire()
            if note:
                echo(note)
        for s in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):   # ValueError: not the main thread
                if signal.getsignal(s) == signal.SIG_DFL:
                    old[s] = signal.signal(s, _exit_on_signal)
        yield locks
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for lk in reversed(locks):
            lk.release()
