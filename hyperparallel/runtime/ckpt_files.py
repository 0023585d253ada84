"""Checkpoint layout on disk, without MindSpore: step directories, completeness, file headers, owners.

A checkpoint of step N (N optimizer steps done) is the directory ``SAVE_DIR/step_<N>/``::

    rank_<r>.safetensors   (or .ckpt)  MindSpore checkpoint files, one per writing rank; names are
                                       the single-process model's (``Parameter.name``) plus the
                                       optimizer's own state names (``moment1.<param>``, ``beta1_power``...)
    config.json                        (Hugging Face models) the model's config, for ``--export-hf``
    meta.json                          step, data position, recipe hash, schedule, P, V, D, files, and
                                       ``digests``: per file of the step (every one but ``meta.json``
                                       and the marker) its size and SHA-256 (a weight file's by its rank)
    COMPLETE                           written last, by rank 0, after every rank has written its file:
                                       the step, the files and the SHA-256 of ``meta.json``

Integrity (:func:`verdict`, the one verdict ``--resume``, ``--resume-from`` and ``hyperparallel ckpt``
give): a step directory counts when its marker is there, ``meta.json`` is the one the marker names
(its digest), its step is the directory's, every recorded file is there with the size and SHA-256
that ``meta.json`` records (a safetensors header is checked too) and no other file is in the step
folder (one written into it after the save is named). Anything else is named: the step is
passed over by ``--resume`` (the next older good step is used) and refused by ``--resume-from``.
``--no-digest`` skips the SHA-256 of the files (sizes and headers are still checked), for huge files;
the log says so. Checkpoints without digests (written before they existed) are checked without them.
Every name is written once: by the lowest pipeline device that updates the chunk holding it
(``dp_index`` 0), chosen from the plan (:func:`chunk_owners`).

The launcher uses this module before launch (which step to resume, truncated files); it reads
safetensors headers (8-byte length + JSON) directly, so it needs no MindSpore.
"""
from __future__ import annotations

import hashlib
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
FORMAT_VERSION = 2   # 2: meta.json's digests cover every file of the step (1: the weight files only)
UNRECORDED_V1 = ("config.json",)   # written without a record by format 1 (accepted there, unverified)
FORMATS = ("safetensors", "ckpt")
REFUSED = "checkpoint refused: "  # line prefix of a rank's refusal; the launcher maps it to exit 2
SAVE_FAILED = "checkpoint save failed: "  # a rank's line when its part of a save could not be written (path, OS error)
REFUSED_INPUT = "input refused: "  # a rank's refusal of a recipe value only a rank can check (e.g. pretrained weights)
_STEP_RE = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (missing, incomplete, corrupt, another model's)."""


def step_dir(save_dir: str, step: int) -> str:
    return os.path.join(save_dir, f"step_{int(step)}")


def rank_file(rank: int, fmt: str) -> str:
    return f"rank_{int(rank)}.{fmt}"


def file_digest(path: str) -> str:
    """SHA-256 of a file, hex (about 0.9 GB/s on one core with the CPU's SHA instructions)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def file_record(path: str, digest: bool = True) -> dict:
    """What ``meta.json`` records of one file: its size and (unless ``digest`` is False) its SHA-256."""
    return {"bytes": os.path.getsize(path), "sha256": file_digest(path) if digest else None}


def step_contents(path: str) -> List[str]:
    """Every file under the step directory ``path`` but ``meta.json`` and the marker, as paths relative to
    it ('/'-separated), sorted: what ``meta.json``'s digests must cover."""
    out = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        rel = os.path.relpath(root, path)
        for name in files:
            r = name if rel == "." else os.path.join(rel, name).replace(os.sep, "/")
            if r not in (META, MARKER):
                out.append(r)
    return sorted(out)


def write_json(path: str, obj: dict) -> None:
    """``obj`` as ``path`` (written beside it, then renamed over it)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def seal_step(path: str, meta: dict, records: Dict[str, dict], digest: bool = True) -> None:
    """Write ``meta.json`` (``meta`` with ``digests``: every file of the step, the given ``records`` (the
    weight files, hashed by their ranks) and each other file recorded here, e.g. ``config.json``), then
    the marker with the SHA-256 of ``meta.json``. Called once every rank has written its files."""
    records = dict(records)
    for name in step_contents(path):
        if name not in records:
            records[name] = file_record(os.path.join(path, name), digest)
    write_json(os.path.join(path, META), dict(meta, digests=records))
    write_json(os.path.join(path, MARKER), {"step": meta["step"], "files": meta["files"],
                                             "meta_sha256": file_digest(os.path.join(path, META))})


def _read_marker(path: str) -> dict:
    try:
        with open(os.path.join(path, MARKER)) as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def verdict(path: str, digests: bool = True) -> str:
    """Why the step directory ``path`` cannot be resumed ('' when it can): the one verdict of
    ``--resume``, ``--resume-from`` and ``hyperparallel ckpt`` (see the module docstring)."""
    if not os.path.isfile(os.path.join(path, MARKER)):
        return f"no {MARKER} marker: not every rank finished writing it"
    marker = _read_marker(path)
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        return str(e)
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), list):
        return f"{os.path.join(path, META)}: not a checkpoint's metadata"
    want = marker.get("meta_sha256")
    if want and file_digest(os.path.join(path, META)) != want:
        return f"{os.path.join(path, META)} was changed after the save (its SHA-256 is not the one {MARKER} records)"
    m = _STEP_RE.match(os.path.basename(os.path.normpath(path)))
    if m and meta.get("step") != int(m.group(1)):
        return f"{os.path.join(path, META)} says step {meta.get('step')!r}, the directory is step {m.group(1)}"
    if "step" in marker and marker["step"] != meta.get("step"):
        return f"{os.path.join(path, META)} says step {meta.get('step')!r}, {MARKER} says {marker['step']!r}"
    records = meta.get("digests") if isinstance(meta.get("digests"), dict) else {}
    if records:   # checkpoints without digests (older ones) have no record of which files they hold
        old = meta.get("format_version", 1) < FORMAT_VERSION if isinstance(meta.get("format_version"), int) else True
        extra = [n for n in step_contents(path) if n not in records and not (old and n in UNRECORDED_V1)]
        if extra:
            return (f"{os.path.join(path, extra[0])} is not covered by the digests {META} records (written into "
                    f"the step after the save)" + (f"; {len(extra) - 1} more such files" if len(extra) > 1 else ""))
    for name in list(meta["files"]) + sorted(n for n in records if n not in meta["files"]):
        f = os.path.join(path, str(name))
        if not os.path.isfile(f):
            return f"{f} is missing although {MARKER} is there (removed after the save)"
        rec = records.get(name) or {}
        if f.endswith(".safetensors"):
            try:
                safetensors_header(f)
            except CheckpointError as e:
                return str(e)
        size = os.path.getsize(f)
        if isinstance(rec.get("bytes"), int) and rec["bytes"] != size:
            return f"{f}: {size} bytes, {META} records {rec['bytes']} (truncated or replaced)"
        if digests and rec.get("sha256") and file_digest(f) != rec["sha256"]:
            return f"{f}: content differs from the SHA-256 {META} records (corrupt or overwritten)"
    return ""


def is_complete(path: str, digests: bool = False) -> bool:
    """The step directory passes :func:`verdict` (by default without the files' SHA-256: cheap)."""
    return verdict(path, digests) == ""


def step_dirs(save_dir: str) -> List[Tuple[int, str]]:
    """Every ``step_<N>`` directory of ``save_dir``, [(step, path)] newest first."""
    out = []
    if os.path.isdir(save_dir):
        for name in os.listdir(save_dir):
            m = _STEP_RE.match(name)
            path = os.path.join(save_dir, name)
            if m and os.path.isdir(path):
                out.append((int(m.group(1)), path))
    return sorted(out, reverse=True)


def _is_save_dir(path: str) -> bool:
    try:
        return any(_STEP_RE.match(n) and os.path.isdir(os.path.join(path, n)) for n in os.listdir(path))
    except OSError:   # not a folder, or one that cannot be listed
        return False


def checkpoint_holding(path: str) -> Tuple[str, str]:
    """("step", STEP_DIR) when ``path`` is or lies inside a step directory (a ``step_<N>`` folder that
    exists or would be one of a save directory), ("save", SAVE_DIR) when it is or lies inside a save
    directory (a folder holding step directories), ("", "") otherwise: where an output must not go."""
    p = os.path.realpath(path)
    chain = []
    while True:
        chain.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for p in chain:   # the innermost first
        if _STEP_RE.match(os.path.basename(p)) and (os.path.isdir(p) or _is_save_dir(os.path.dirname(p))):
            return "step", p
    for p in chain:
        if _is_save_dir(p):
            return "save", p
    return "", ""


def list_steps(save_dir: str, digests: bool = False) -> Tuple[List[Tuple[int, str]], List[Tuple[int, str]]]:
    """(complete, incomplete) step directories of ``save_dir``, each [(step, path)] newest first, by
    :func:`verdict` (``digests``: the files' SHA-256 checked too)."""
    complete, incomplete = [], []
    for step, path in step_dirs(save_dir):
        (complete if is_complete(path, digests) else incomplete).append((step, path))
    return complete, incomplete


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
    why: Dict[str, str] = field(default_factory=dict)   # {ignored path: its verdict}
    digests: bool = True   # the files' SHA-256 were checked (False: --no-digest)

    def to_json(self) -> dict:
        return {"path": self.path, "files": self.files, "step": self.step, "meta": self.meta,
                "ignored": self.ignored, "why": self.why, "digests": self.digests}

    @staticmethod
    def from_json(obj: dict) -> "Source":
        return Source(obj["path"], list(obj["files"]), int(obj.get("step", 0)), dict(obj.get("meta") or {}),
                      list(obj.get("ignored") or []), dict(obj.get("why") or {}), bool(obj.get("digests", True)))


def _format_of(path: str) -> str:
    for fmt in FORMATS:
        if path.endswith("." + fmt):
            return fmt
    raise CheckpointError(f"{path}: not a MindSpore checkpoint file (.safetensors or .ckpt)")


def resolve(path: str, digests: bool = True) -> Source:
    """The checkpoint at ``path``: a step directory (must pass :func:`verdict`), a save directory (its
    newest step that passes; newer ones reported in ``ignored`` with their verdict in ``why``), a Hugging
    Face model directory (``config.json`` + ``model.safetensors`` or a shard index: step 0) or one
    checkpoint file (a plain single-process MindSpore checkpoint: step 0). Safetensors headers are
    checked; ``digests``: the files' SHA-256 too (False: ``--no-digest``)."""
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
        why: Dict[str, str] = {}
        for _, p in step_dirs(path):   # newest first; each verified only until one passes
            bad = verdict(p, digests)
            if not bad:
                meta = read_meta(p)
                return Source(p, [os.path.join(p, f) for f in meta["files"]], int(meta["step"]), meta,
                              list(why), why, digests)   # verdict checked the headers and digests
            why[p] = bad
        listed = f" (incomplete: {'; '.join(f'{os.path.basename(p)}: {w}' for p, w in why.items())})" if why else ""
        raise CheckpointError(f"no complete checkpoint in {path}{listed}")
    elif os.path.isdir(path):
        bad = verdict(path, digests)
        if bad:
            raise CheckpointError(f"{path}: incomplete or damaged checkpoint: {bad}")
        meta = read_meta(path)
        src = Source(path, [os.path.join(path, f) for f in meta["files"]], int(meta["step"]), meta, digests=digests)
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
    """Global ranks that write a file (dp_index 0, tp_index 0 of each owning device), ascending."""
    return sorted({d * plan.data_parallel * plan.tensor_parallel for d in chunk_owners(plan).values()})


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
