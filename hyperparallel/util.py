"""Small helpers every front end shares: the one-line error, run-directory names, order statistics,
output paths checked before the work and files written whole."""
from __future__ import annotations

import re
import sys
from typing import Sequence


def error(msg: str) -> int:
    """Print the one-line ``error: field: message`` and return exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    return 2


def slug(text: str) -> str:
    """``text`` as a file-name part (runs/<slug>)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    if not v:
        raise ValueError("median of no values")
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    v = sorted(xs)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def output_file(flag: str, path: str, suffixes: Sequence[str] = (), inputs: Sequence[str] = ()) -> str:
    """``path`` if a file can be written there (refused naming ``flag`` otherwise, before any work):
    not a directory, its folder exists and is writable, (with ``suffixes``) it ends with one, and it is
    none of the ``inputs`` (files the command reads, e.g. its recipe: never overwritten by its output)."""
    import os
    from .errors import SpecError
    if not path:
        raise SpecError(flag, "empty file name")
    if os.path.isdir(path):
        raise SpecError(flag, f"{path} is a directory; give a file name")
    if suffixes and not path.lower().endswith(tuple(suffixes)):
        raise SpecError(flag, f"{path}: the file name must end with {' or '.join(suffixes)}")
    for src in inputs:
        if src and os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src):
            raise SpecError(flag, f"{path} is the input {src}; give another file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SpecError(flag, f"folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise SpecError(flag, f"{path} cannot be written (permission denied)")
    return path


def writable_dir(flag: str, path: str) -> str:
    """``path`` if it is (or can be created as) a writable directory; refused naming ``flag``."""
    import os
    from .errors import SpecError
    if not path:
        raise SpecError(flag, "empty directory name")
    if os.path.exists(path) and not os.path.isdir(path):
        raise SpecError(flag, f"{path} is a file, not a directory")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise SpecError(flag, f"{path} cannot be created: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(flag, f"{path} cannot be written ({probe}: permission denied)")
    return path


class LibraryOutput:
    """``with LibraryOutput(path) as con:`` everything this process writes to its stdout and stderr (file
    descriptors 1 and 2: Python's warnings and logging, MindSpore's, MindFormers' and mindone's prints, C
    and C++ log lines) goes to the log file ``path``; the project's own lines go to the console through
    ``con.say(text)`` (``err=True``: stderr), as the launcher shows only rank 0's progress of the pipeline's
    worker logs. Leaving the block (an exception too: its traceback then reaches the console) restores both."""

    def __init__(self, path: str):
        self.path = path
        self._saved = ()

    def __enter__(self) -> "LibraryOutput":
        import os
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._out = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
        self._err = os.fdopen(os.dup(self._saved[1]), "w", buffering=1)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        return self

    def say(self, text: str, err: bool = False) -> None:
        print(text, file=self._err if err else self._out, flush=True)

    def __exit__(self, *exc) -> None:
        import os
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()   # a library's buffered C stdout belongs in the log, not on the console at exit
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._out.close()
        self._err.close()


def _flush_c_stdio() -> None:
    try:
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def write_text(path: str, text: str) -> None:
    """``text`` as the file ``path``, whole or not at all: written to a hidden file beside it, then renamed
    over it; the hidden file is removed when anything fails (no ``.tmp`` left behind)."""
    import os
    import tempfile
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _umask() -> int:
    import os
    mask = os.umask(0)
    os.umask(mask)
    return mask
