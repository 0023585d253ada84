"""Explicit interpreter hooks: timing, fault injection and action clocks are passed in, never patched in.

The interpreter asks its hooks once, when it is built, to wrap each of its callables by category
(``wrap(category, name, fn)``: ``compute`` for the tape's ``forward``/``no_grad``/``grad``,
``comm`` for ``send``/``recv``/``all_reduce``/``broadcast``, ``data`` for building a micro-batch's
tensors and loading the model input, ``accumulate`` for gradient adds), and calls
``before_action(interp, step, index, action)`` before every action of a step. The defaults do
nothing (the wrapped callables are the originals, so a plain run pays nothing).
"""
from __future__ import annotations

import os
import signal
from typing import Callable, Sequence



class Hooks:
    """No-op hooks; subclass and override what you need."""

    def wrap(self, category: str, name: str, fn: Callable) -> Callable:
        return fn

    def before_action(self, interp, step: int, index: int, action) -> None:
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

    @property
    def per_action(self) -> bool:
        return any(h.per_action for h in self.hooks)


class FaultInjection(Hooks):
    """``HP_FAULT=RANK:STEP[:kill]`` makes that rank die in the middle of that step: ``os._exit(13)``
    after a log line, or with ``kill`` a silent SIGKILL. (``HP_FAULT=RANK:save:N[:kill]``, dying
    while saving step N, is handled by the checkpoint saver.)"""

    def __init__(self, rank: int, step: int, kill: bool):
        self.rank, self.step, self.kill = rank, step, kill

    @staticmethod
    def from_env(rank: int):
        spec = os.environ.get("HP_FAULT", "").split(":")
        if spec[0] != str(rank) or len(spec) < 2 or spec[1] == "save":
            return None
        return FaultInjection(rank, int(spec[1]), spec[2:] == ["kill"])

    def before_action(self, interp, step, index, action) -> None:
        if step == self.step and index == len(interp.program) // 2:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"fault injection: rank {self.rank} exits at step {step}, action {index}/{len(interp.program)}",
                  flush=True)
            os._exit(13)
