"""A compared case of ``bench`` and ``simulate``: a schedule spelling with settings of its own,
``SCHEDULE|key=value|...`` (``--set`` overrides for that case only), so the same schedule can be
compared under different data settings in one run, e.g. ``--schedule transpose
--schedule 'transpose|data.balance=encoder'``."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import SpecError


def split_case(spelling: str) -> Tuple[Optional[str], List[str]]:
    """(schedule spelling, the case's ``key=value`` overrides) of ``SCHEDULE|key=value|...``."""
    if not isinstance(spelling, str) or "|" not in spelling:
        return spelling, []
    head, *rest = spelling.split("|")
    sets = [s.strip() for s in rest]
    for s in sets:
        if "=" not in s or not s.split("=", 1)[0].strip():
            raise SpecError("--schedule", f"{spelling!r}: after '|' give key=value settings of this case, got {s!r}")
    return head.strip() or None, sets
