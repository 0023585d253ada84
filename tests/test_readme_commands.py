"""README's command blocks work as printed: every command names an entry point the venv has, its
files exist (or an earlier README command writes them), its arguments parse, and the pure-Python
ones (plan, check, simulate) run and exit 0."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT

VENV_BIN = os.path.dirname(sys.executable)   # the venv the tests run in: what `source .venv/bin/activate` gives
RUN_NOW = ("plan", "check", "simulate")
COMMAND = re.compile(r"^([A-Z_]+=\S*\s+)*(hyperparallel|python|msrun|make|source|\.venv/bin/\S+)\s")


def readme_commands():
    """(line number, argv) of every command in README's ```bash and plain ``` blocks (``text`` blocks are
    synopses), with backslash continuations joined and comments dropped."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    out, lang, buf, start = [], None, "", 0
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            lang = line[3:].strip() if lang is None else None
            continue
        if lang not in ("bash", "", "sh"):
            continue
        if not buf:
            if not COMMAND.match(line):
                continue   # not a command (a file listing, output)
            start = i
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        cmd, buf = buf, ""
        out.append((start, shlex.split(cmd, comments=True)))
    return out


COMMANDS = readme_commands()


def test_readme_has_the_commands_a_user_runs():
    firsts = {a[0] for _, a in COMMANDS}
    assert {"make", "hyperparallel", "python", "msrun", "source"} <= firsts, firsts
    assert len(COMMANDS) >= 25


def _produced(path: str) -> bool:
    """Files an earlier README command writes (data sets, runs, checkpoints)."""
    return path.startswith(("runs/", "data/demo", "data/heavy", "data/skewed", "ckpt/", "model."))


def _reads_produced_data(argv) -> bool:
    """``simulate --data-steps`` reads the recipe's data set: one an earlier README command writes."""
    if "--data-steps" not in argv:
        return False
    from hyperparallel.recipe import load_recipe
    recipe = next(a for a in argv[2:] if a.endswith((".yaml", ".yml")))
    raw = load_recipe(os.path.join(ROOT, recipe)).raw   # base_config merged (a profile inherits its recipe's data)
    path = str((raw.get("data") or {}).get("path", ""))
    return _produced(os.path.relpath(path, ROOT) if os.path.isabs(path) else path)


@pytest.mark.parametrize("line,argv", COMMANDS, ids=[f"README:{n}" for n, _ in COMMANDS])
def test_readme_command_works_as_printed(line, argv, tmp_path):
    env = [a for a in argv if re.match(r"^[A-Z_]+=", a)]
    argv = argv[len(env):]
    exe = argv[0]
    if exe == "make":
        with open(os.path.join(ROOT, "Makefile")) as f:
            assert re.search(rf"^{argv[1]}:", f.read(), re.M), f"README:{line}: no make target {argv[1]}"
        return
    if exe == "source":
        assert argv[1] == ".venv/bin/activate", argv
        return
    name = exe[len(".venv/bin/"):] if exe.startswith(".venv/bin/") else exe
    assert os.path.exists(os.path.join(VENV_BIN, name)), f"README:{line}: {name} is not in the venv"
    files = [a for a in argv[1:] if re.match(r"^[\w.-]+/[\w./-]+\.(ya?ml|py|sh|json)$", a)]
    for f in files:
        assert os.path.exists(os.path.join(ROOT, f)) or _produced(f), f"README:{line}: {f} does not exist"
    if name == "python":
        script = argv[1]
        assert os.path.isfile(os.path.join(ROOT, script)), f"README:{line}: {script}"
        return
    if name == "msrun":
        assert any(a.endswith(".py") and os.path.isfile(os.path.join(ROOT, a)) for a in argv), argv
        return
    from hyperparallel.cli import build_parser
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"README:{line}: {' '.join(argv)}: arguments do not parse ({e})")
    if argv[1] in RUN_NOW and not any(_produced(f) for f in files) and not _reads_produced_data(argv):
        args = [a if not a.startswith(("out/", "runs/")) else str(tmp_path / os.path.basename(a)) for a in argv[1:]]
        p = subprocess.run([os.path.join(VENV_BIN, "hyperparallel"), *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"README:{line}: {' '.join(argv)}\n{p.stderr[-2000:]}"
