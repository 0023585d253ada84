"""After a failed ``make test``: every failed or errored test and the lines of its report that say why,
printed last (a CI log's tail then names them; pytest's own summary sits above the workers' captured
output). Reads the JUnit XML that pytest wrote (``--junitxml``).

    python tools/test_recap.py REPORT.xml
"""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

WHY = re.compile(r"(^E\s|error:|Error|rank \d+|hung|failed|Recv)", re.I)
PER_TEST = 12      # report lines shown per distinct failure
MAX_TESTS = 20


def failures(path: str):
    """[(test id, kind, report text)] of the failed and errored tests in a JUnit XML report."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                tid = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                out.append((tid, kind, (el.get("message") or "") + "\n" + (el.text or "")))
    return out


def why(text: str) -> list:
    """The report's lines that say why: assertion lines (``E ...``), error and rank lines, at most PER_TEST."""
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    picked = [l for l in lines if WHY.search(l)] or lines[:PER_TEST]
    return [l[:300] for l in picked[-PER_TEST:]]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: test_recap.py REPORT.xml", file=sys.stderr)
        return 2
    try:
        got = failures(argv[0])
    except (OSError, ET.ParseError) as e:
        print(f"test recap: no report to read ({e})")
        return 0
    print(f"== test recap: {len(got)} failed or errored ==")
    seen = {}
    for tid, kind, text in got[:MAX_TESTS]:
        lines = why(text)
        key = "\n".join(lines)
        if key in seen:
            print(f"{kind.upper()} {tid}: as {seen[key]}")
            continue
        seen[key] = tid
        print(f"{kind.upper()} {tid}")
        for l in lines:
            print("    " + l)
    if len(got) > MAX_TESTS:
        print(f"... and {len(got) - MAX_TESTS} more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
