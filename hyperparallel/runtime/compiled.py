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

Whether a region's chunks compile is the adapter's word where it gives one
(``ModelAdapter.compile_reason``, pure Python: the launcher's start banner prints the same answer before
launch); else the chunk Cell's (a tensor-only body or not). A chunk that runs eager says which and why in
the log. A compile that
fails at run time stops the job naming the rank and the chunk (``mpipe.compile_fallback: error``,
the default) or, with ``compile_fallback: eager``, logs MindSpore's first error line and runs that
chunk eager from then on.

A worker that runs several cases of one job in one process (the test suites' launches, a multi-case
job) keeps its compiled chunks in a :class:`GraphPool`: MindSpore keys a jit graph on the Cell it was
compiled for, so a fresh Cell of the same chunk would compile every shape again (about 1-1.5 s a
graph on CPU). A later case whose chunk is the same (the same model section, data shapes, seed, region
and layers, the same parameter names and shapes) takes the earlier Cell and its graphs, with the fresh
Cell's initial values written into its parameters in place; the graph reads its parameters at run
time, so the case computes what a fresh Cell would. :meth:`Body.stats` counts the graphs such a
case reused apart from those it compiled.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Dict, List, Optional, Tuple

from .compat import JIT_SPLITS_BACKWARD, graphs_compiled, jit, taping, write_param


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
                 log: Callable[[str], None] = print, reason: Optional[str] = None):
        """``reason``: the adapter's ``compile_reason`` of the chunk's region: why it runs eager, '' (it
        compiles: its Cell must give the tensor-only body), or None (the Cell decides)."""
        self.key, self.cell, self.fallback, self.rank, self.log = key, cell, fallback, rank, log
        self.reason = ""               # why this chunk runs eager although jit was asked for
        self.compiles: List[float] = []       # seconds of every call that compiled (compile + one run)
        self.new_compiles: List[float] = []   # those since the last take_new() (the step's compiles)
        self.signatures: set = set()          # distinct input signatures seen (shapes, dtypes)
        self.graphs: set = set()              # (signature, on the tape) of every graph this Body compiled
        self.earlier: set = set()             # those compiled in earlier cases (a pooled Body, GraphPool)
        self.graph = None
        if mode == "jit":
            tensor_only = hasattr(cell, "graph_body") and hasattr(cell, "graph_args")
            if reason == "" and not tensor_only:
                raise RuntimeError(f"chunk {self.name}: the model adapter's compile_reason({key[0]!r}) says its "
                                   f"chunks compile, but {type(cell).__name__} has no graph_body/graph_args")
            if reason:
                self.reason = reason
            elif not tensor_only:
                self.reason = getattr(cell, "graph_reason", "") or \
                    f"{type(cell).__name__} has no tensor-only body (graph_body/graph_args)"
            else:
                self.graph = jit(cell.graph_body)
        self.asked = mode
        self._used: set = set()               # (signature, on the tape) of this case's calls

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
        sig = _signature((x,) + tuple(args))
        self.signatures.add(sig)
        self._used.add((sig, taping()))
        n, t0 = graphs_compiled(), time.perf_counter()   # MindSpore decides when to compile: count what it did
        try:
            out = self.graph(x, *args)
        except Exception as e:   # MindSpore's compile errors are RuntimeError/TypeError/ValueError...
            return self._failed(e, x, tensors)
        if graphs_compiled() > n:
            dt = time.perf_counter() - t0
            self.compiles.append(dt)
            self.new_compiles.append(dt)
            self.graphs.add((sig, taping()))
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
        """``compiles``: graphs compiled in this case; ``reused``: graphs it ran that an earlier case of
        the launch compiled (:class:`GraphPool`); ``shapes``: distinct input shapes it met."""
        return {"chunk": self.name, "mode": self.mode, "asked": self.asked, "reason": self.reason,
                "compiles": len(self.compiles), "compile_s": round(sum(self.compiles), 4),
                "shapes": len(self.signatures), "reused": len(self._used & self.earlier)}

    def next_case(self, key: Tuple[str, int], cell, fallback: str, rank: int,
                  log: Callable[[str], None]) -> "Body":
        """This pooled Body for a later case: ``cell``'s (a fresh build of the same chunk) values written
        into the kept Cell's parameters in place, the per-case counts cleared, the graphs kept."""
        for p, fresh in zip(self.cell.get_parameters(), cell.get_parameters()):
            write_param(p, fresh)
        self.key, self.fallback, self.rank, self.log = key, fallback, rank, log
        self.compiles, self.new_compiles, self.signatures = [], [], set()
        self.earlier, self._used = set(self.graphs), set()
        return self


def _layout(cell) -> list:
    return [(p.name, tuple(p.shape), str(p.dtype)) for p in cell.get_parameters()]


class GraphPool:
    """Compiled chunk bodies kept between the cases that one process runs one after another (see the
    module docstring). A Body is taken out while a case runs and given back when it ends, so two live
    runtimes never share a Cell."""

    def __init__(self):
        self._kept: Dict[tuple, Body] = {}

    def take(self, key: tuple, chunk: Tuple[str, int], cell, fallback: str, rank: int, log) -> Optional[Body]:
        """The kept compiled Body of ``key`` (:func:`pool_key`) ready to be this case's ``chunk``, or None
        (then build a new one)."""
        body = self._kept.get(key)
        if body is None or body.graph is None or _layout(body.cell) != _layout(cell):
            return None
        del self._kept[key]
        return body.next_case(chunk, cell, fallback, rank, log)

    def give_back(self, keys: Dict[Tuple[str, int], tuple], bodies: Dict[Tuple[str, int], Body]) -> None:
        for k, body in bodies.items():
            if body.graph is not None and k in keys:
                self._kept[keys[k]] = body


def pool_key(model_section, data_shapes, seed, region: str, start: int, stop: int) -> tuple:
    """What makes two chunks the same: everything the adapter builds a chunk from (the recipe's ``model``
    section, the data shapes, the seed) and the chunk's region and layers."""
    return (json.dumps([model_section, data_shapes, seed], sort_keys=True, default=repr), region, start, stop)


def build_bodies(chunks: dict, mode: str, fallback: str = "error", rank: int = 0,
                 log: Callable[[str], None] = print, pool: Optional[GraphPool] = None,
                 keys: Optional[Dict[Tuple[str, int], tuple]] = None,
                 reason: Callable[[str], Optional[str]] = lambda region: None) -> Dict[Tuple[str, int], Body]:
    """A :class:`Body` per chunk of this rank (``chunks``: (region, index) -> Cell); with ``pool`` and
    ``keys`` (chunk -> :func:`pool_key`) under ``jit``, a kept Body of the same chunk where there is one
    (its Cell then replaces the fresh one: read the Cells back from the Bodies). ``reason``: the adapter's
    ``compile_reason`` (region -> why eager, '' or None; :class:`Body`)."""
    out = {}
    for key, cell in sorted(chunks.items()):
        why = reason(key[0]) if mode == "jit" else None
        kept = pool.take(keys[key], key, cell, fallback, rank, log) if pool is not None and keys and mode == "jit" \
            and key in keys and not why else None
        out[key] = kept if kept is not None else Body(key, cell, mode, fallback, rank, log, why)
    return out



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
    done = [b.stats() for b in bodies.values() if b.compiled and b.signatures]
    if not done:
        return None
    return f"compiled: rank {rank}: " + "; ".join(
        f"{s['chunk']} {s['compiles']} graph(s) for {s['shapes']} input shape(s) {s['compile_s']:.2f} s"
        + (f", {s['reused']} reused from an earlier case" if s["reused"] else "") for s in done)
