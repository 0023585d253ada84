"""Checkpoint layout on disk, without MindSpore: step directories, completeness, file headers, owners.

A checkpoint of step N (N optimizer steps done) is the directory ``SAVE_DIR/step_<N>/``::

    rank_<r>.safetensors   (or .ckpt)  MindSpore checkpoint files, one per writing rank; names are
                                       the single-process model's (``Parameter.name``) plus the
                                       optimizer's own state names (``moment1.<param>``, ``beta1_power``...)
    meta.json                          step, data position, recipe hash, schedule, P, V, D, files
    COMPLETE                           written last, by rank 0, after every rank has written its file

A step directory without ``COMPLETE`` (or with a listed file missing) is incomplete and ignored.
Every name is written once: by the lowest pipeline device that updates the chunk holding it
(``dp_index`` 0), chosen from the plan (:func:`chunk_owners`).

The launcher uses this module before launch (which step to resume, truncated files); it reads
safetensors headers (8-byte length + JSON) directly, so it needs no MindSpore.
"""
from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from hyperparallel.models import hf_dir
from hyperparallel.mpipe import ir

MARKER = "COMPLETE"
META = "meta.json"
FORMATS = ("safetensors", "ckpt")
REFUSED = "checkpoint refused: "  # line prefix of a rank's refusal; the launcher maps it to exit 2
REFUSED_INPUT = "input refused: "  # a rank's refusal of a recipe value only a rank can check (e.g. pretrained weights)
_STEP_RE = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (missing, incomplete, corrupt, another model's)."""


def step_dir(save_dir: str, step: int) -> str:
    return os.path.join(save_dir, f"step_{int(step)}")


def rank_file(rank: int, fmt: str) -> str:
    return f"rank_{int(rank)}.{fmt}"


def is_complete(path: str) -> bool:
    """A step directory counts when its marker and every file its metadata lists exist."""
    if not os.path.isfile(os.path.join(path, MARKER)):
        return False
    try:
        meta = read_meta(path)
    except CheckpointError:
        return False
    return all(os.path.isfile(os.path.join(path, f)) for f in meta.get("files", []))


def list_steps(save_dir: str) -> Tuple[List[Tuple[int, str]], List[Tuple[int, str]]]:
    """(complete, incomplete) step directories of ``save_dir``, each [(step, path)] newest first."""
    complete, incomplete = [], []
    if os.path.isdir(save_dir):
        for name in os.listdir(save_dir):
            m = _STEP_RE.match(name)
            path = os.path.join(save_dir, name)
            if m and os.path.isdir(path):
                (complete if is_complete(path) else incomplete).append((int(m.group(1)), path))
    return sorted(complete, reverse=True), sorted(incomplete, reverse=True)


def read_meta(path: str) -> dict:
    try:
        with open(os.path.join(path, META)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, META)}: unreadable ({e})") from None


def safetensors_header(path: str) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """{name: (dtype, shape)} from a safetensors file's header; CheckpointError naming the file
    when it is truncated or not a safetensors file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: corrupt checkpoint file (truncated: {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CheckpointError(f"{path}: corrupt checkpoint file (truncated header: "
                                      f"{size} bytes, header says {n + 8})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from None
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: corrupt checkpoint file (not a safetensors header)") from None
    out, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            out[name] = (str(info["dtype"]), tuple(int(d) for d in info["shape"]))
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise CheckpointError(f"{path}: corrupt checkpoint file (bad entry {name!r})") from None
    if 8 + n + end != size:
        raise CheckpointError(f"{path}: corrupt checkpoint file (truncated: {size} bytes, "
                              f"expected {8 + n + end})")
    return out


@dataclass
class Source:
    """What a run starts from: checkpoint files, the step to continue at, and their metadata."""

    path: str
    files: List[str]
    step: int = 0
    meta: dict = field(default_factory=dict)
    ignored: List[str] = field(default_factory=list)  # incomplete step directories passed over

    def to_json(self) -> dict:
        return {"path": self.path, "files": self.files, "step": self.step, "meta": self.meta,
                "ignored": self.ignored}

    @staticmethod
    def from_json(obj: dict) -> "Source":
        return Source(obj["path"], list(obj["files"]), int(obj.get("step", 0)), dict(obj.get("meta") or {}),
                      list(obj.get("ignored") or []))


def _format_of(path: str) -> str:
    for fmt in FORMATS:
        if path.endswith("." + fmt):
            return fmt
    raise CheckpointError(f"{path}: not a MindSpore checkpoint file (.safetensors or .ckpt)")


def resolve(path: str) -> Source:
    """The checkpoint at ``path``: a step directory (must be complete), a save directory (its
    newest complete step; incomplete ones reported in ``ignored``), a Hugging Face model directory
    (``config.json`` + ``model.safetensors`` or a shard index: step 0) or one checkpoint file
    (a plain single-process MindSpore checkpoint: step 0). Safetensors headers are checked."""
    if os.path.isfile(path):
        _format_of(path)
        src = Source(path, [path])
    elif os.path.isdir(path) and hf_dir.is_hf_dir(path):
        try:
            src = Source(path, hf_dir.weight_files(path))
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    elif os.path.isdir(path) and _STEP_RE.match(os.path.basename(os.path.normpath(path))) is None \
            and not os.path.exists(os.path.join(path, META)):
        complete, incomplete = list_steps(path)
        ignored = [p for s, p in incomplete if not complete or s > complete[0][0]]
        if not complete:
            why = f" (incomplete: {', '.join(os.path.basename(p) for p in ignored)})" if ignored else ""
            raise CheckpointError(f"no complete checkpoint in {path}{why}")
        src = resolve(complete[0][1])
        src.ignored = ignored
        return src
    elif os.path.isdir(path):
        if not is_complete(path):
            raise CheckpointError(f"{path}: incomplete checkpoint (no {MARKER} marker or a file missing)")
        meta = read_meta(path)
        src = Source(path, [os.path.join(path, f) for f in meta["files"]], int(meta["step"]), meta)
    else:
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    for f in src.files:
        if _format_of(f) == "safetensors":
            safetensors_header(f)
    return src


def chunk_owners(plan: ir.Plan) -> Dict[Tuple[str, int], int]:
    """{(region, chunk): pipeline device that writes it}: the lowest device updating the chunk
    (backward of the chunk or the region's replica all-reduce), else the lowest holding it."""
    updates: Dict[Tuple[str, int], set] = {}
    for d, prog in plan.programs.items():
        reduced = {a.region for a in prog if a.kind == ir.ALLREDUCE and a.tensor == ir.WGRAD}
        for c in plan.chunks_on(d):
            if plan.trainable.get(c.region, True) and (
                    c.region in reduced or any(a.kind in (ir.B, ir.BW, ir.W) and a.region == c.region
                                               and a.chunk == c.index for a in prog)):
                updates.setdefault((c.region, c.index), set()).add(d)
    return {(c.region, c.index): min(updates.get((c.region, c.index)) or c.devices) for c in plan.chunks}


def writers(plan: ir.Plan) -> List[int]:
    """Global ranks that write a file (dp_index 0 of each owning device), ascending."""
    return sorted({d * plan.data_parallel for d in chunk_owners(plan).values()})


def scalar_owner(plan: ir.Plan) -> int:
    """The pipeline device that writes the optimizer's global state (``beta1_power``...)."""
    owners = chunk_owners(plan)
    trained = [d for (r, _), d in owners.items() if plan.trainable.get(r, True)]
    return min(trained or owners.values())


def _first(names: List[str], k: int = 4) -> str:
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


def check_names(ckpt: Dict[str, Tuple[int, ...]], params: Dict[str, Tuple[int, ...]],
                state: Dict[str, Tuple[int, ...]], hyper=()) -> Tuple[List[str], bool]:
    """Compare a checkpoint's {name: shape} with a model's parameters and optimizer state.

    Returns (problems, load_state). Problems: model parameters missing or of another shape,
    names that are neither a parameter nor optimizer state of one (``<slot>.<param>`` or an
    undotted global such as ``beta1_power``). Optimizer state is loaded when the checkpoint has
    any of it (then all of it must be there), else the optimizer starts fresh.
    """
    problems = []
    shape = {n: tuple(s) for n, s in ckpt.items()}
    missing = sorted(set(params) - set(shape))
    if missing:
        problems.append(f"missing parameters: {_first(missing)}")
    wrong = sorted(n for n in params if n in shape and shape[n] != tuple(params[n]))
    if wrong:
        problems.append("wrong shapes: " + _first([f"{n} {list(shape[n])} (model {list(params[n])})"
                                                   for n in wrong], 3))
    extra = sorted(n for n in set(shape) - set(params) if "." in n and n.partition(".")[2] not in params)
    if extra:
        problems.append(f"names not in this model: {_first(extra)}")
    need = {n: tuple(s) for n, s in state.items() if n not in hyper}
    load_state = bool(set(need) & set(shape))
    if load_state and not problems:  # another model's state differs wherever its parameters do
        miss = sorted(set(need) - set(shape))
        if miss:
            problems.append(f"optimizer state missing: {_first(miss)}")
        bad = sorted(n for n in need if n in shape and shape[n] != need[n])
        if bad:
            problems.append("optimizer state of wrong shape: " + _first(bad, 3))
    return problems, load_state


def optimizer_state_names(names) -> List[str]:
    """The names of a checkpoint that are optimizer state by MindSpore's naming: ``<slot>.<name>``
    of another name in it, or undotted globals (``beta1_power``, ``global_step``)."""
    names = set(names)
    return sorted(n for n in names if "." not in n or n.partition(".")[2] in names)
