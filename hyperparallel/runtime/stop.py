"""Preemption on the ranks: a signal asks every rank to stop after the current step.

ModelArts and Kubernetes stop a job with SIGTERM, then SIGKILL after a grace period; Ctrl-C sends
SIGINT. On a rank, the first SIGTERM/SIGINT only sets a flag (:class:`StopRequest`): the rank
finishes the step it is in, the flag is all-reduced with the step's loss (so every rank stops after
the same step, even when only one got the signal), the step is checkpointed when ``--save-dir`` is
set, rank 0 prints a ``STOPPED`` line and the ranks exit 0. A second signal, or the grace time
running out, exits at once (status 128 + signal): the last complete checkpoint stays as it was (a
step directory being written has no COMPLETE marker and is ignored by ``--resume``).

When msrun itself dies (SIGTERM to msrun, whose default action is to die and leave its workers
running), the kernel sends each rank SIGHUP (:func:`follow_parent`), which counts as a first
signal and never as a second one.
"""
from __future__ import annotations

import os
import signal
import threading

STOPPED = "stopped on signal: "   # rank 0's line; the launcher maps it to its preemption exit status

_PR_SET_PDEATHSIG = 1


def follow_parent(sig: int = signal.SIGHUP) -> None:
    """Ask Linux to send ``sig`` to this process when its parent (msrun) dies; nothing elsewhere."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:   # the parent died before the request: act as if it had just died
            os.kill(os.getpid(), sig)
    except (OSError, AttributeError):
        pass


def _say(text: str) -> None:
    # os.write, not print: a signal handler may interrupt a print on the same stream
    try:
        os.write(1, (text + "\n").encode())
    except OSError:
        pass


class StopRequest:
    """The rank's stop flag (see the module docstring); ``grace_s``: how long after the first signal the
    rank exits at once on its own (the launcher, when alive, enforces its own grace first)."""

    def __init__(self, rank: int, grace_s: float):
        self.rank, self.grace_s = rank, float(grace_s)
        self.signum = None

    def install(self) -> "StopRequest":
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_parent_gone)
        return self

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _on_signal(self, signum, frame) -> None:
        if self.signum is not None:
            _say(f"rank {self.rank}: second signal ({signal.Signals(signum).name}): stopping at once")
            os._exit(128 + signum)
        self._first(signum)

    def _on_parent_gone(self, signum, frame) -> None:
        if self.signum is None:
            _say(f"rank {self.rank}: msrun is gone (SIGHUP): stopping after this step")
            self._first(signal.SIGTERM)

    def _first(self, signum) -> None:
        self.signum = signum
        t = threading.Timer(self.grace_s, self._expired)
        t.daemon = True
        t.start()

    def _expired(self) -> None:
        _say(f"rank {self.rank}: {self.grace_s:g} s after {self.name} and not stopped yet: stopping at once")
        os._exit(128 + (self.signum or signal.SIGTERM))
