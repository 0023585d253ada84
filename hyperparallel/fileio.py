"""File helpers every layer may use (the algebra's layer: no MindSpore, no recipe): a name kept inside its
root folder, and JSON-lines files whose last line a full disk may have cut short."""
from __future__ import annotations


def jsonl_rows(path: str):
    """([(line, record)], note) of a JSON-lines file, every line ending in a newline. A last line that is
    not a complete JSON object (a write cut short, e.g. by a full disk) is left out, ``note`` saying so
    ('' otherwise); such a line before the last: SpecError naming the file and the line number."""
    import json
    from .errors import SpecError
    with open(path, errors="replace") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    rows, note = [], ""
    for i, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
            why = "" if isinstance(rec, dict) else "not a JSON object"
        except ValueError as e:
            rec, why = None, getattr(e, "msg", str(e))
        if why and i == len(lines) - 1:
            note = f"{path}: its last line {n} is cut short ({why}; e.g. a full disk): left out"
        elif why:
            raise SpecError(f"{path} line {n}", f"not a JSON line ({why}); fix or remove that line")
        else:
            rows.append((line if line.endswith("\n") else line + "\n", rec))
    return rows, note


def inside(root: str, name: str):
    """``name`` joined to the folder ``root`` (absolute, normalised) if it stays inside ``root`` once
    symlinks are resolved (``os.path.realpath`` of both, then ``os.path.commonpath``); None if it leaves
    it (an absolute name elsewhere, ``..``, a symlink out). Decided from the names and the links inside
    ``root`` only, so the answer never tells whether a file outside exists."""
    import os
    path = os.path.abspath(os.path.join(root, name))
    try:
        real_root, real = os.path.realpath(root), os.path.realpath(path)
        return path if os.path.commonpath([real_root, real]) == real_root else None
    except ValueError:   # a NUL character in the name; different drives (Windows)
        return None
