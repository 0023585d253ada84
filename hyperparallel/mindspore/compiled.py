"""Chunk bodies as the interpreter runs them: compiled MindSpore graphs (``mpipe.compile: jit``) or
op by op (``eager``).

A chunk Cell opts in to compiling by giving a tensor-only body (the adapter's side of the contract,
:mod:`hyperparallel.models.base`): ``graph_args(tensors)`` picks the side inputs this chunk reads
from the micro-batch's tensors (a fixed-length tuple; ``None`` where it reads nothing, so a side input
whose shape varies, e.g. the text ids, reaches only the chunks that read it), and
``graph_body(self, x, *args)`` computes what ``forward(x, tensors)`` computes. :class:`Body` wraps
``graph_body`` with ``mindspore.jit`` once, one static graph per distinct input shape
(:func:`~.compat.jit`, which says why not MindSpore's dynamic shapes): a chunk whose inputs keep one
shape (every LLM chunk after the first) compiles once and never again; a chunk whose input shape
varies (an encoder chunk: the images of each micro-batch) compiles once per distinct shape it meets
(per grad mode: a chunk run both on the tape and off it compiles each mode's own), so the data's
distinct shapes bound its compiles. Every call
that compiled is counted and timed (compile plus one run, :meth:`Body.stats`), so the step time of
a step that compiled can be told apart.

The compiled forward runs under the runtime's tape (:class:`~.compat.Tape`) like the eager one, and
its backward through the graph's own backward. MindSpore's jit graph cannot split its backward on
the tape (see :mod:`.compat`, ``JIT_SPLITS_BACKWARD``), so a compiled chunk reports ``splits =
False``: the interpreter's ``B`` then computes the weight grads with the input grad in one backward
call and keeps them for the ``W`` action (exact; the W work moves into B), and says so in the log.

A chunk that has no tensor-only body runs eager, and the log says which and why. A compile that
fails at run time stops the job naming the rank and the chunk (``mpipe.compile_fallback: error``,
the default) or, with ``compile_fallback: eager``, logs MindSpore's first error line and runs that
chunk eager from then on.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

from .compat import JIT_SPLITS_BACKWARD, graphs_compiled, jit


class CompileError(RuntimeError):
    """A chunk's compile failed and ``mpipe.compile_fallback`` is ``error``."""


def _signature(args) -> tuple:
    """What MindSpore keys its compiled graphs on: every tensor's shape and dtype, other values as is."""
    sig = []
    for a in args:
        shape = getattr(a, "shape", None)
        sig.append((tuple(shape), str(a.dtype)) if shape is not None and hasattr(a, "dtype") else repr(a))
    return tuple(sig)


class Body:
    """The forward of one chunk, called as ``body(x, tensors)`` (what the interpreter calls)."""

    def __init__(self, key: Tuple[str, int], cell, mode: str, fallback: str = "error", rank: int = 0,
                 log: Callable[[str], None] = print):
        self.key, self.cell, self.fallback, self.rank, self.log = key, cell, fallback, rank, log
        self.reason = ""               # why this chunk runs eager although jit was asked for
        self.compiles: List[float] = []       # seconds of every call that compiled (compile + one run)
        self.new_compiles: List[float] = []   # those since the last take_new() (the step's compiles)
        self.signatures: set = set()          # distinct input signatures seen (shapes, dtypes)
        self.graph = None
        if mode == "jit":
            if not (hasattr(cell, "graph_body") and hasattr(cell, "graph_args")):
                self.reason = getattr(cell, "graph_reason", "") or \
                    f"{type(cell).__name__} has no tensor-only body (graph_body/graph_args)"
            else:
                self.graph = jit(cell.graph_body)
        self.asked = mode

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    @property
    def compiled(self) -> bool:
        return self.graph is not None

    @property
    def splits(self) -> bool:
        """Can its backward run as a separate input grad (B) and weight grad (W) on the tape?"""
        return not self.compiled or JIT_SPLITS_BACKWARD

    @property
    def mode(self) -> str:
        return "jit" if self.compiled else "eager"

    def __call__(self, x, tensors):
        if self.graph is None:
            return self.cell.forward(x, tensors)
        args = self.cell.graph_args(tensors)
        self.signatures.add(_signature((x,) + tuple(args)))
        n, t0 = graphs_compiled(), time.perf_counter()   # MindSpore decides when to compile: count what it did
        try:
            out = self.graph(x, *args)
        except Exception as e:   # MindSpore's compile errors are RuntimeError/TypeError/ValueError...
            return self._failed(e, x, tensors)
        if graphs_compiled() > n:
            dt = time.perf_counter() - t0
            self.compiles.append(dt)
            self.new_compiles.append(dt)
        return out

    def _failed(self, e: Exception, x, tensors):
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        msg = f"rank {self.rank}: chunk {self.name}: compile failed: {first}"
        if self.fallback != "eager":
            raise CompileError(msg + " (mpipe.compile_fallback: error; set it to eager to run this chunk eager)") \
                from None
        self.log(msg + "; this chunk runs eager from now on (mpipe.compile_fallback: eager)")
        self.graph, self.reason = None, f"compile failed: {first}"
        return self.cell.forward(x, tensors)

    def take_new(self) -> List[float]:
        """The first-call times since the last call (the compiles of the step that just ran)."""
        out, self.new_compiles = self.new_compiles, []
        return out

    def stats(self) -> dict:
        return {"chunk": self.name, "mode": self.mode, "asked": self.asked, "reason": self.reason,
                "compiles": len(self.compiles), "compile_s": round(sum(self.compiles), 4),
                "shapes": len(self.signatures)}


def build_bodies(chunks: dict, mode: str, fallback: str = "error", rank: int = 0,
                 log: Callable[[str], None] = print) -> Dict[Tuple[str, int], Body]:
    """A :class:`Body` per chunk of this rank (``chunks``: (region, index) -> Cell)."""
    return {key: Body(key, cell, mode, fallback, rank, log) for key, cell in sorted(chunks.items())}


def describe(bodies: Dict[Tuple[str, int], Body], rank: int, split: set) -> str:
    """The once-per-rank log line: every chunk's mode, and why a chunk runs eager or how its B/W run
    (``split``: the chunks with separate W actions on this rank)."""
    parts = []
    for b in bodies.values():
        s = f"{b.name} {b.mode}"
        if b.asked == "jit" and not b.compiled:
            s += f" ({b.reason})"
        elif b.compiled and b.key in split and not b.splits:
            s += " (B computes the weight grads too, W adds them: a jit graph's backward does not split)"
        parts.append(s)
    return f"compile: rank {rank}: " + "; ".join(parts)


def summary(bodies: Dict[Tuple[str, int], Body], rank: int) -> Optional[str]:
    """The end-of-run log line: compiles (distinct input shapes) and compile time per compiled chunk."""
    done = [b.stats() for b in bodies.values() if b.compiles]
    if not done:
        return None
    return f"compiled: rank {rank}: " + "; ".join(f"{s['chunk']} {s['compiles']} graph(s) for {s['shapes']} input "
                                                  f"shape(s) {s['compile_s']:.2f} s" for s in done)
