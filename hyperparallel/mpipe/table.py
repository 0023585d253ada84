"""Plain-text rendering of programs and comparison tables (for the CLI)."""
from __future__ import annotations

from typing import List, Sequence

from .ir import Plan


def _cell(v) -> str:
    return "-" if v is None else str(v)


def program_table(plan: Plan) -> str:
    """One block per device; one line per action: index, kind, region, chunk, micro-batch, peer."""
    lines = []
    for d in sorted(plan.programs):
        prog = plan.programs[d]
        lines.append(f"device {d} ({len(prog)} actions)")
        lines.append(f"  {'idx':>4}  {'kind':<9} {'region':<10} {'chunk':>5} {'micro':>5} {'peer':>5}  note")
        for i, a in enumerate(prog):
            note = []
            if a.tensor:
                note.append(a.tensor)
            if a.group is not None:
                note.append(f"group={a.group if isinstance(a.group, str) else list(a.group)}")
            if a.root is not None:
                note.append(f"root={a.root}")
            if a.step:
                note.append(f"for step+{a.step}")
            if a.pair is not None:
                note.append(f"overlap pair {a.pair}")
            lines.append(f"  {i:>4}  {a.kind:<9} {_cell(a.region):<10} {_cell(a.chunk):>5} {_cell(a.micro):>5} "
                         f"{_cell(a.peer):>5}  {' '.join(note)}")
        lines.append("")
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: List[Sequence]) -> str:
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
