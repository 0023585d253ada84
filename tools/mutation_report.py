"""Mutation testing of the checker and the cost model (``make mutation``): run mutmut with the repo's
``setup.cfg [mutmut]`` section in a scratch copy of the tree, then write ``docs/mutation.md``: the score
per file and every mutant the fast tests did not kill, with its diff and, where one is written in
``tools/mutation_equivalent.txt`` (``MUTANT_NAME: why it cannot change behaviour``), why it is
equivalent. Not part of CI (it takes minutes on 2 cores); rerun when check.py or cost.py change.

    python tools/mutation_report.py [--out docs/mutation.md] [--keep DIR]
    python tools/mutation_report.py --rerun DIR   # after new tests: re-run only what DIR's run did not kill

``--rerun DIR`` takes a run kept with ``--keep DIR`` (check.py and cost.py must be unchanged since), copies the
current tests in and re-runs only the mutants that run did not kill (a killed mutant stays killed when tests are
added), then writes the page naming both commits. ``--notes-only DIR`` rewrites the page from DIR's results (after
editing ``tools/mutation_equivalent.txt``).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = ("hyperparallel", "tests", "recipes", "tools", "pytest.ini", "setup.cfg")
NOTES = os.path.join(ROOT, "tools", "mutation_equivalent.txt")


def _mutmut(*args, cwd):
    exe = os.path.join(os.path.dirname(sys.executable), "mutmut")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def _notes() -> dict:
    out = {}
    if os.path.exists(NOTES):
        with open(NOTES) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and ": " in line:
                    name, why = line.split(": ", 1)
                    out[name.strip()] = why.strip()
    return out


def _file_of(mutant: str) -> str:
    """``hyperparallel.mpipe.check.x_check_fifo__mutmut_5`` -> ``hyperparallel/mpipe/check.py``."""
    module = mutant.split(".x")[0] if ".x" in mutant else mutant.rsplit(".", 1)[0]
    return module.replace(".", "/") + ".py"


def _diff(mutant: str, cwd: str) -> str:
    shown = _mutmut("show", mutant, cwd=cwd).stdout
    return "\n".join(ln for ln in shown.splitlines() if re.match(r"^[-+](?![-+])", ln))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "hyperparallel", "tests"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" with uncommitted changes" if dirty else "")
    except OSError:
        return "unknown"


def _status(work: str) -> dict:
    res = _mutmut("results", "--all", "true", cwd=work)
    rows = [ln.strip().rsplit(": ", 1) for ln in res.stdout.splitlines() if ": " in ln]
    return {name: st for name, st in rows}


def report(work: str, commit: str = "") -> str:
    status = _status(work)
    per_file = defaultdict(Counter)
    for name, st in status.items():
        per_file[_file_of(name)][st] += 1
    notes = _notes()
    lines = ["# Mutation testing: the checker and the cost model", "",
             "Written by `python tools/mutation_report.py` (`make mutation`): mutmut mutates "
             "`hyperparallel/mpipe/check.py` and `cost.py` and runs the fast tests named in `setup.cfg [mutmut]` "
             "against each mutant. A killed mutant failed a test; a surviving one changed the code and no test "
             "noticed. Each survivor below is a test to write, or (where `tools/mutation_equivalent.txt` says "
             "why) a change that cannot alter behaviour. Not in CI: rerun when those files change.", "",
             f"Measured on commit {commit or _commit()}.", "",
             "| file | mutants | killed | survived | no test ran | timeout | score |", "|---|---|---|---|---|---|---|"]
    for fn in sorted(per_file):
        c = per_file[fn]
        total = sum(c.values())
        killed = c["killed"]
        lines.append(f"| `{fn}` | {total} | {killed} | {c['survived']} | {c['no tests']} | {c['timeout']} | "
                     f"{100.0 * killed / total:.1f}% |")
    left = [n for n, st in sorted(status.items()) if st in ("survived", "no tests")]
    explained = [n for n in left if n in notes]
    lines += ["", f"{len(left)} mutants not killed, {len(explained)} of them explained as equivalent.", ""]
    for n in left:
        lines.append(f"### `{n}` ({status[n]})")
        lines.append("")
        if n in notes:
            lines.append(f"Equivalent: {notes[n]}")
            lines.append("")
        lines += ["```diff", _diff(n, work), "```", ""]
    return "\n".join(lines) + "\n"


MUTATED = ("hyperparallel/mpipe/check.py", "hyperparallel/mpipe/cost.py")


def _commit_file(work: str) -> str:
    return os.path.join(work, "mutation-commit.txt")


def rerun(work: str, max_children: int) -> str:
    """Re-run the mutants a kept run did not kill against the current tests; return the page's commit line."""
    for rel in MUTATED:
        with open(os.path.join(ROOT, rel)) as a, open(os.path.join(work, rel)) as b:
            if a.read() != b.read():
                raise SystemExit(f"error: {rel} changed since the run kept in {work}: run the whole mutation again")
    for dst in (work, os.path.join(work, "mutants")):
        shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(dst, "tests"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    left = [n for n, st in sorted(_status(work).items()) if st in ("survived", "no tests", "timeout")]
    if left:
        run = _mutmut("run", "--max-children", str(max_children), *left, cwd=work)
        if run.returncode != 0:
            print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"error: mutmut run failed (exit {run.returncode})")
    first = open(_commit_file(work)).read().strip() if os.path.exists(_commit_file(work)) else "unknown"
    return f"{first} (all mutants); the {len(left)} still not killed re-run on {_commit()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "mutation.md"))
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (default: a temporary folder)")
    ap.add_argument("--rerun", metavar="DIR",
                    help="re-run what the run kept in DIR did not kill, with the current tests")
    ap.add_argument("--notes-only", metavar="DIR", help="rewrite the page from the run kept in DIR")
    ap.add_argument("--max-children", type=int, default=2)
    args = ap.parse_args(argv)
    if args.rerun or args.notes_only:
        work = args.rerun or args.notes_only
        line = rerun(work, args.max_children) if args.rerun else None
        if line:
            with open(os.path.join(work, "mutation-commit-line.txt"), "w") as f:
                f.write(line)
        elif os.path.exists(os.path.join(work, "mutation-commit-line.txt")):
            line = open(os.path.join(work, "mutation-commit-line.txt")).read().strip()
        else:
            line = open(_commit_file(work)).read().strip() if os.path.exists(_commit_file(work)) else ""
        with open(args.out, "w") as f:
            f.write(report(work, line))
        print(f"wrote {args.out}")
        return 0
    work = args.keep or tempfile.mkdtemp(prefix="hp-mutation-")
    try:
        for name in COPY:
            src, dst = os.path.join(ROOT, name), os.path.join(work, name)
            if os.path.isdir(src):
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(src, dst)
        commit = _commit()
        with open(_commit_file(work), "w") as f:
            f.write(commit)
        run = _mutmut("run", "--max-children", str(args.max_children), cwd=work)
        if run.returncode != 0:
            print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
            print(f"error: mutmut run failed (exit {run.returncode})", file=sys.stderr)
            return 1
        text = report(work, commit)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
