"""Explicit interpreter hooks: timing, fault injection and action clocks are passed in, never patched in.

The interpreter asks its hooks once, when it is built, to wrap each of its callables by category
(``wrap(category, name, fn)``: ``compute`` for the tape's ``forward``/``no_grad``/``grad``,
``comm`` for ``send``/``recv``/``all_reduce``/``broadcast``, ``data`` for building a micro-batch's
tensors and loading the model input, ``accumulate`` for gradient adds), and calls
``before_action(interp, step, index, action)`` before every action of a step, and ``phase(step, name)``
when the rank's runtime enters work between programs (``reduce``: the step's loss all-reduce,
``optimizer``: the update). The defaults do nothing (the wrapped callables are the originals, so a
plain run pays nothing).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable, Sequence



class Hooks:
    """No-op hooks; subclass and override what you need."""

    def wrap(self, category: str, name: str, fn: Callable) -> Callable:
        return fn

    def before_action(self, interp, step: int, index: int, action) -> None:
        pass

    def phase(self, step: int, name: str) -> None:
        pass

    @property
    def per_action(self) -> bool:
        """Whether ``before_action`` does anything (the interpreter skips the call otherwise)."""
        return type(self).before_action is not Hooks.before_action


class Chain(Hooks):
    """Several hooks at once: wraps nest (the first is innermost), ``before_action`` in order."""

    def __init__(self, hooks: Sequence[Hooks]):
        self.hooks = [h for h in hooks if h is not None]

    def wrap(self, category, name, fn):
        for h in self.hooks:
            fn = h.wrap(category, name, fn)
        return fn

    def before_action(self, interp, step, index, action) -> None:
        for h in self.hooks:
            if h.per_action:
                h.before_action(interp, step, index, action)

    def phase(self, step, name) -> None:
        for h in self.hooks:
            h.phase(step, name)

    @property
    def per_action(self) -> bool:
        return any(h.per_action for h in self.hooks)


class Progress(Hooks):
    """The rank's heartbeat (:class:`hyperparallel.watch.Heartbeat`) before every action and phase: step,
    program index, action kind and the global ranks it waits on (a receive or a send: its peer -- a send that
    does not return is held up by its peer, e.g. one whose process is stopped; a collective: the group's
    other members), for the launcher's hang verdict."""

    def __init__(self, heartbeat, comm):
        self.hb, self.comm = heartbeat, comm
        self._others = [r for r in range(comm.world) if r != comm.rank]
        self._memo = {}

    def _waits(self, a):
        if a.kind in ("SEND", "RECV"):
            return (self.comm.global_rank(a.peer),)
        if a.kind in ("ALLREDUCE", "BROADCAST", "REDUCESCATTER"):
            return tuple(r for r in self.comm.ranks_of(a.group) if r != self.comm.rank)
        return ()

    def before_action(self, interp, step, index, action) -> None:
        key = id(action)
        if key not in self._memo:
            a = action
            what = f"{a.region}/{a.chunk}" + (f" micro {a.micro}" if a.micro is not None else "")
            if a.kind in ("SEND", "RECV"):
                what += f" {a.tensor} {'to' if a.kind == 'SEND' else 'from'} rank {self.comm.global_rank(a.peer)}"
            self._memo[key] = (self._waits(a), what)
        waits, what = self._memo[key]
        self.hb.beat(step, action.kind, index, len(interp.program), waits, what)

    def phase(self, step, name) -> None:
        self.hb.beat(step, name, waits=self._others if name in ("reduce", "gather", "barrier") else ())


class FaultInjection(Hooks):
    """``HP_FAULT=RANK:STEP[:kill|:hang|:nan|:SIGINT|:SIGTERM]`` makes that rank fail in the middle of that
    step: ``os._exit(13)`` after a log line, with ``kill`` a silent SIGKILL, with ``hang`` it stops making
    progress (sleeps for ever, alive); with ``nan`` every gradient it computes in that step is NaN (as an
    overflow would make them; ``train.nonfinite``). With a signal's name the rank sends that signal to the
    launcher (msrun's parent: a Ctrl-C or a ``kill`` while that step runs) and goes on once the launcher's
    forwarded signal has reached it (``stopper``, the rank's :class:`~.stop.StopRequest`), so the signal
    lands in that step, deterministically. (``HP_FAULT=RANK:save:N[:kill|:enospc]``, failing while saving
    step N, is handled by the checkpoint saver.)"""

    MODES = ("exit", "kill", "hang", "nan", "SIGINT", "SIGTERM")

    def __init__(self, rank: int, step: int, kill: bool = False, mode: str = "", stopper=None):
        self.rank, self.step, self.stopper = rank, step, stopper
        self.mode = mode or ("kill" if kill else "exit")
        self._now = -1   # the step the rank is in (nan mode)

    def wrap(self, category: str, name: str, fn: Callable) -> Callable:
        if self.mode != "nan" or name != "grad":
            return fn

        def grad(*args, **kw):
            out = fn(*args, **kw)
            if self._now != self.step:
                return out
            return tuple(g * float("nan") if g is not None else g for g in out)
        return grad

    @property
    def kill(self) -> bool:
        return self.mode == "kill"

    @staticmethod
    def from_env(rank: int, stopper=None):
        spec = os.environ.get("HP_FAULT", "").split(":")
        if spec[0] != str(rank) or len(spec) < 2 or spec[1] == "save":
            return None
        mode = spec[2] if len(spec) > 2 else "exit"
        if mode not in FaultInjection.MODES:
            raise ValueError(f"HP_FAULT={os.environ['HP_FAULT']}: mode {mode!r} unknown; allowed: "
                             f"{', '.join(FaultInjection.MODES)}")
        return FaultInjection(rank, int(spec[1]), mode=mode, stopper=stopper)

    def _signal_launcher(self, step: int) -> None:
        """Send the mode's signal to the launcher; wait (up to 60 s) until the forwarded one reached this rank."""
        launcher = _parent_of(os.getppid())
        print(f"fault injection: rank {self.rank} sends {self.mode} to the launcher (pid {launcher}) in step {step}",
              flush=True)
        os.kill(launcher, getattr(signal, self.mode))
        deadline = time.time() + 60
        while not (self.stopper and self.stopper.requested) and time.time() < deadline:
            time.sleep(0.05)

    def before_action(self, interp, step, index, action) -> None:
        self._now = step
        if step == self.step and index == len(interp.program) // 2 and self.mode != "nan":
            if self.mode.startswith("SIG"):
                self.step = None   # once
                return self._signal_launcher(step)
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":   # alive, silent: only the launcher's hang watchdog ends the job
                print(f"fault injection (hang): rank {self.rank} stops making progress at step {step}, action "
                      f"{index}/{len(interp.program)} ({action.kind})", flush=True)
                while True:
                    time.sleep(60)
            print(f"fault injection: rank {self.rank} exits at step {step}, action {index}/{len(interp.program)}",
                  flush=True)
            os._exit(13)


def _parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
