"""Activation recompute as part of the schedule: a region option, a derivation pass, and its program form.

A region's skeleton may carry ``recompute``: ``none`` (default), ``full`` (every layer of every chunk),
``layers=K`` (the first K layers of every chunk), or, in the list form (and from MindFormers'
``recompute_config.recompute``), one count per chunk of the region in data-flow order.

A recomputed forward keeps only its chunk input: its ``F`` runs without the tape, and an ``R`` (the
forward again, with the tape) runs on the same device right before the chunk's first backward task
(``B`` or ``BW``). ``layers=K`` of a chunk of n > K layers gives the chunk an inner boundary: the
derivation splits it into a recomputed chunk (its first K layers) and a kept one (the other n - K),
both on the chunk's devices, *after* the orders placed the unsplit chunks (placement, order, owners
and timing estimates all see the P x V pipeline chunks), so the split changes no schedule; the
plan's chunk list then shows the two parts (the recomputed one with ``recompute: true``). A task of a
split chunk expands in place, in data-flow order for forwards and in reverse for backwards::

    F(c)  -> F(c_r) F(c_k)        B(c) -> B(c_k) R(c_r) B(c_r)
    W(c)  -> W(c_k) W(c_r)        BW(c) -> BW(c_k) R(c_r) BW(c_r)

so the checker, the cost model (an R costs a forward of its layers; a recomputed forward holds its
input until its R), the drawer and the runtime all read the recompute from the same programs.
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import SpecError
from .ir import B, BW, F, R, W, Chunk

NONE, FULL = "none", "full"
FORMS = ("none", "full", "layers=K")
Spec = Union[str, Tuple[int, ...]]   # "none", "full", "layers=K", or per-chunk counts
_LAYERS = re.compile(r"^layers\s*=\s*(\d+)$")


def parse(field: str, value) -> Spec:
    """The canonical recompute option of ``value`` (a string, true/false, or a list of per-chunk counts)."""
    if value is None or value is False:
        return NONE
    if value is True:
        return FULL
    if isinstance(value, (list, tuple)):
        if not value or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in value):
            raise SpecError(field, f"{list(value)!r}: give one whole number >= 0 of recomputed layers per chunk")
        return tuple(value)
    if isinstance(value, str):
        text = value.strip()
        if text in (NONE, FULL):
            return text
        m = _LAYERS.match(text)
        if m:
            k = int(m.group(1))
            return NONE if k == 0 else f"layers={k}"
    raise SpecError(field, f"{value!r} unknown; allowed: {', '.join(FORMS)}")


def is_on(spec: Spec) -> bool:
    return spec != NONE and not (isinstance(spec, tuple) and not any(spec))


def per_chunk(field: str, spec: Spec, sizes: Sequence[int]) -> List[int]:
    """Recomputed layers of every chunk of one region (``sizes``: the chunks' layers, in index order),
    checked: K at most the layers of each chunk, one count per chunk."""
    if spec == NONE:
        return [0] * len(sizes)
    if spec == FULL:
        return sizes
    if isinstance(spec, tuple):
        if len(spec) != len(sizes):
            raise SpecError(field, f"{list(spec)} has {len(spec)} entries; the region has {len(sizes)} chunks "
                                   f"(give one count per chunk)")
        counts = list(spec)
    else:
        counts = [int(spec.split("=", 1)[1])] * len(sizes)
    for c, (k, n) in enumerate(zip(counts, sizes)):
        if k > n:
            raise SpecError(field, f"{k} recomputed layers but chunk {c} has {n}; allowed: 0..{min(sizes)} "
                                   f"(layers=K), or full")
    return counts


def split(chunks: Sequence[Chunk], counts: Mapping[Tuple[str, int], int]) -> Tuple[List[Chunk], Dict]:
    """(the plan's chunks, {(region, pipeline chunk): (recomputed part or None, kept part or None)}).

    A chunk with 0 < K < n recomputed layers becomes a recomputed chunk of its first K layers and a kept
    chunk of the rest (indices renumbered in the region); K = n marks the whole chunk recomputed."""
    out: List[Chunk] = []
    parts: Dict[Tuple[str, int], Tuple[Optional[int], Optional[int]]] = {}
    nxt: Dict[str, int] = {}
    for c in chunks:
        k = counts.get((c.region, c.index), 0)
        i = nxt.get(c.region, 0)
        if k == 0:
            out.append(Chunk(c.region, i, c.start, c.stop, c.devices))
            parts[(c.region, c.index)] = (None, i)
            nxt[c.region] = i + 1
        elif k >= c.layers:
            out.append(Chunk(c.region, i, c.start, c.stop, c.devices, recompute=True))
            parts[(c.region, c.index)] = (i, None)
            nxt[c.region] = i + 1
        else:
            out.append(Chunk(c.region, i, c.start, c.start + k, c.devices, recompute=True))
            out.append(Chunk(c.region, i + 1, c.start + k, c.stop, c.devices))
            parts[(c.region, c.index)] = (i, i + 1)
            nxt[c.region] = i + 2
    return out, parts


def expand(seqs: Mapping[int, Sequence], parts: Mapping) -> Dict[int, list]:
    """Per-device compute sequences of pipeline chunks -> sequences of the plan's chunks (table in the
    module docstring). A task is a NamedTuple with ``kind``, ``region``, ``chunk`` (``_replace`` keeps
    the rest, e.g. the micro-batch and step)."""
    out = {}
    for d, seq in seqs.items():
        new = []
        for t in seq:
            rec, kept = parts[(t.region, t.chunk)]
            if t.kind == F:
                new += [t._replace(chunk=i) for i in (rec, kept) if i is not None]
            elif t.kind in (B, BW):
                if kept is not None:
                    new.append(t._replace(chunk=kept))
                if rec is not None:
                    new += [t._replace(kind=R, chunk=rec), t._replace(chunk=rec)]
            elif t.kind == W:
                new += [t._replace(chunk=i) for i in (kept, rec) if i is not None]
            else:   # R of a central backward: never of a recomputed region (refused), so one part
                new.append(t._replace(chunk=kept if kept is not None else rec))
        out[d] = new
    return out


def expand_pairs(pairs: Mapping[Tuple[str, int, int], int], body: str, parts: Mapping) -> Dict:
    """Overlap-pair ids keyed by (kind, pipeline chunk, micro) of the body -> by the plan's chunks: a
    forward's pair goes to its first part, an input-grad's to its first backward (the kept part's)."""
    out = {}
    for (kind, c, m), pid in pairs.items():
        rec, kept = parts[(body, c)]
        first = (rec if rec is not None else kept) if kind == F else (kept if kept is not None else rec)
        out[(kind, first, m)] = pid
    return out
