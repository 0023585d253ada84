"""Small helpers shared by ``hyperparallel profile`` and ``hyperparallel bench``."""
from __future__ import annotations

import re
import sys


def error(msg: str) -> int:
    """Print the one-line ``error: field: message`` and return exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    return 2


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
