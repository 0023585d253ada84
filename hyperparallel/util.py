"""Small helpers every front end shares: the one-line error, run-directory names, order statistics."""
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
