"""The index of a conversations file: every sample read, laid out and checked, pixels never decoded.

A *layout* (:mod:`.merge_layout`, or a model family's, :mod:`.formats`) turns one record into a :class:`Sample`
(``layout.parse(where, record, check_files)``, SampleProblem if it cannot be used) and checks one
image file fully for ``data check`` (``layout.decode_check(path)``). ``check_files(path)`` is the
header check (:func:`check_image`: the file exists and PIL verifies it; returns its (width, height)).

The data stays inside its root, in bounded memory: an image name is resolved under ``data.image_root``
and refused if it leaves it (:func:`image_path`), and a line longer than ``data.max_line_bytes`` is
skipped unparsed without being held whole (:func:`read_records`).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, List, Tuple

from .text import SampleProblem
from ..errors import SpecError
from ..fileio import inside


@dataclass(frozen=True)
class Sample:
    where: str               # "FILE:LINE" (jsonl) or "FILE sample N" (json list)
    id: str
    files: Tuple[str, ...]   # image files in encoder order (images, then video frames), absolute
    enc: Any                 # the layout's encoded sample (text.Encoded, or a family layout's own)

    @property
    def loss_tokens(self) -> int:
        """Positions whose next token is an answer token: what the loss of this sample is a mean over."""
        return int(self.enc.answer[1:].sum())


@dataclass(frozen=True)
class Problem:
    where: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.message}"


LINE_KEY = "data.max_line_bytes"
LINE_FACTOR, LINE_SLACK = 64, 1 << 20   # its default: 64 bytes per token of data.seq_len + 1 MiB
LINE_DEFAULT = f"{LINE_FACTOR} x data.seq_len + 1 MiB"
CHUNK = 1 << 20   # bytes read at a time while skipping the rest of a line that is too long


def _lines(f, limit: int):
    """(line number, the line's bytes or None if it is longer than ``limit`` bytes, its length) of a
    binary file, in bounded memory: at most ``limit + 1`` bytes of a line are held, the rest of a longer
    line is skipped in chunks up to its newline."""
    n = 0
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        n += 1
        if raw.endswith(b"\n") or len(raw) <= limit:
            yield n, raw, len(raw)
            continue
        size = len(raw)
        while not raw.endswith(b"\n"):
            raw = f.readline(CHUNK)
            if not raw:
                break
            size += len(raw)
        yield n, None, size


def _too_long(where: str, size: int, limit: int, what: str = "line") -> Problem:
    return Problem(where, "line_too_long", f"{what} of {size:,} bytes is longer than {limit:,} bytes, the cap "
                                           f"{LINE_KEY} sets (default: {LINE_DEFAULT}); "
                                           "not parsed")


def read_records(path: str, max_line_bytes: int = 1 << 62):
    """(where, record or None, problem or None) for every sample of a .json list or .jsonl file. A sample
    longer than ``max_line_bytes`` (a .jsonl line, or a .json list element written back as JSON) is a
    ``line_too_long`` problem, found before it is parsed or tokenized (a .jsonl line is never held whole)."""
    name = path
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:
            for n, raw, size in _lines(f, max_line_bytes):
                where = f"{name}:{n}"
                if raw is None:
                    yield where, None, _too_long(where, size, max_line_bytes)
                    continue
                try:
                    line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    yield where, None, Problem(where, "not_utf8", f"byte 0x{raw[e.start]:02x} at column "
                                                                  f"{e.start + 1} is not UTF-8")
                    continue
                if not line.strip():
                    continue
                try:
                    yield where, json.loads(line), None
                except json.JSONDecodeError as e:
                    yield where, None, Problem(where, "malformed_json", f"{e.msg} at column {e.pos + 1}")
                except RecursionError:
                    yield where, None, Problem(where, "malformed_json", "nested too deep")
        return
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError("data.path", f"{name}:{line}: byte 0x{raw[e.start]:02x} (byte {e.start} of the file) is not "
                                     "UTF-8; the whole file is unusable") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError("data.path", f"{name}:{e.lineno}: malformed JSON ({e.msg}, column {e.colno}); "
                         "the whole file is unusable") from None
    except RecursionError:
        raise SpecError("data.path", f"{name}: nested too deep to read; the whole file is unusable") from None
    if not isinstance(data, list):
        raise SpecError("data.path", f"{name}: expected a JSON list of samples")
    for i, rec in enumerate(data):
        where = f"{name} sample {i}"
        try:
            size = len(json.dumps(rec, ensure_ascii=False).encode("utf-8"))
        except RecursionError:
            size = 0   # nested as deep as json.loads allowed: the layout refuses it as a bad record
        if size > max_line_bytes:
            yield where, None, _too_long(where, size, max_line_bytes, "sample (as JSON)")
        else:
            yield where, rec, None


def image_path(cfg, name: str) -> str:
    """The absolute path of a sample's image file ``name`` (relative to ``data.image_root``);
    SampleProblem('outside_image_root') if it resolves outside that folder (an absolute path elsewhere,
    ``..``, a symlink out), unless ``data.allow_outside_root`` is true. Refused before the file is
    touched, so the message is the same whether an outside file exists or not."""
    if "\0" in name:
        raise SampleProblem("bad_record", f"image file name {name!r} contains a NUL character")
    if cfg.allow_outside_root:
        return os.path.abspath(os.path.join(cfg.root, name))
    path = inside(cfg.root, name)
    if path is None:
        raise SampleProblem("outside_image_root", f"image {name!r} resolves outside data.image_root {cfg.root} "
                                                  "(an absolute path elsewhere, '..' or a symlink out); not read "
                                                  "(data.allow_outside_root: true reads such files)")
    return path


def check_image(path: str) -> Tuple[int, int]:
    """Header check without decoding pixels: exists, and PIL recognises and verifies it; (width, height)."""
    if not os.path.isfile(path):
        raise SampleProblem("missing_image", f"image file not found: {path}")
    from PIL import Image
    try:
        with Image.open(path) as im:
            size = im.size
            im.verify()
    except Exception as e:
        raise SampleProblem("unreadable_image", f"not a readable image: {path} ({type(e).__name__}: {e})") from None
    return int(size[0]), int(size[1])


def build_index(cfg, layout, check_files=check_image):
    """(usable samples, problems) of the whole file ``cfg.path``, in file order."""
    samples: List[Sample] = []
    problems: List[Problem] = []
    for where, rec, prob in read_records(cfg.path, cfg.line_limit()):
        if prob is not None:
            problems.append(prob)
            continue
        try:
            samples.append(layout.parse(where, rec, check_files))
        except SampleProblem as e:
            sid = rec.get("id") if isinstance(rec, dict) else None
            problems.append(Problem(where + (f" (id {sid})" if sid is not None else ""), e.kind, str(e)))
    return samples, problems


def summary(problems: List[Problem]) -> str:
    c = Counter(p.kind for p in problems)
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items()))
