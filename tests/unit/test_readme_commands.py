"""The command blocks of README.md and docs/*.md work as printed: every command names an entry point the venv
has, its files exist (or an earlier documented command writes them), its arguments parse with the CLI's own
parser, and the pure-Python ones (plan, check, simulate) run and exit 0. README's command synopsis names
every subcommand the CLI has and only flags that subcommand accepts."""
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


DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))


def doc_commands(doc: str):
    """(line number, argv) of every command in a document's ```bash and plain ``` blocks (``text`` blocks are
    synopses), with backslash continuations joined and comments dropped."""
    with open(os.path.join(ROOT, doc)) as f:
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


COMMANDS = [(f"{doc}:{n}", argv) for doc in DOCS for n, argv in doc_commands(doc)]


def test_readme_starts_with_the_two_set_up_commands_then_the_venv():
    """The quick start is ``make demo``, ``make test``, ``source .venv/bin/activate``, in that order."""
    first = [argv for _, argv in doc_commands("README.md")[:3]]
    assert first == [["make", "demo"], ["make", "test"], ["source", ".venv/bin/activate"]], first


def test_readme_first_run_trains_and_checks_against_the_reference():
    """README's first real run writes the demo data, checks it, and trains it both on ranks and as the
    single-process reference (the same recipe)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    start = lines.index("## A first real run") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## ")) + 1
    cmds = [argv for n, argv in doc_commands("README.md") if start < n < end]   # that section's commands
    assert ["python", "tools/make_demo_data.py", "data/demo"] in cmds
    trains = [a for a in cmds if a[:2] == ["hyperparallel", "train"]]
    assert any("--reference" not in a for a in trains) and any("--reference" in a for a in trains), trains
    assert len({a[2] for a in trains}) == 1, trains


def _synopsis():
    """{subcommand: synopsis text} from README's ```text block of ``hyperparallel ...`` lines (a line that
    does not start with ``hyperparallel`` continues the one above)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = re.search(r"^## Commands\n\n```text\n(.*?)^```", text, re.S | re.M)
    assert block, "README has no ## Commands synopsis block"
    out, cur = {}, None
    for line in block.group(1).splitlines():
        m = re.match(r"^hyperparallel (data check|\w+)", line)
        if m:
            cur = m.group(1)
            assert cur not in out, f"README synopsis: {cur} given twice"
            out[cur] = ""
        assert cur, line
        out[cur] += " " + line
    return out


def _subparsers():
    """{name: parser} of the CLI, ``data check`` as one name."""
    import argparse
    from hyperparallel.cli import build_parser

    def subs(p):
        return next(a.choices for a in p._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in subs(build_parser()).items():
        if name == "data":
            out.update({f"data {n}": q for n, q in subs(p).items()})
        else:
            out[name] = p
    return out


def test_readme_synopsis_names_every_subcommand():
    assert set(_synopsis()) == set(_subparsers())


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_readme_synopsis_flags_are_the_subcommands_own(name):
    """Every ``--flag`` the synopsis prints for a subcommand is one its parser accepts."""
    text = _synopsis().get(name, "")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text))
    known = {s for a in _subparsers()[name]._actions for s in a.option_strings}
    assert flags, f"README synopsis: no flags for {name}"
    assert flags <= known, f"README synopsis of {name}: {sorted(flags - known)} not accepted by its parser"


def _produced(path: str) -> bool:
    """Files an earlier documented command writes (data sets, runs, checkpoints)."""
    return path.startswith(("runs/", "data/demo", "data/heavy", "data/skewed", "ckpt/", "model."))


def _reads_produced_data(argv) -> bool:
    """``simulate --data-steps`` reads the recipe's data set: one an earlier documented command writes."""
    if "--data-steps" not in argv:
        return False
    from hyperparallel.recipe import load_recipe
    recipe = next(a for a in argv[2:] if a.endswith((".yaml", ".yml")))
    raw = load_recipe(os.path.join(ROOT, recipe)).raw   # base_config merged (a profile inherits its recipe's data)
    path = str((raw.get("data") or {}).get("path", ""))
    return _produced(os.path.relpath(path, ROOT) if os.path.isabs(path) else path)


@pytest.mark.parametrize("line,argv", COMMANDS, ids=[n for n, _ in COMMANDS])
@pytest.mark.slow
def test_readme_command_works_as_printed(line, argv, tmp_path):
    env = [a for a in argv if re.match(r"^[A-Z_]+=", a)]
    argv = argv[len(env):]
    exe = argv[0]
    if exe == "make":
        with open(os.path.join(ROOT, "Makefile")) as f:
            assert re.search(rf"^{argv[1]}:", f.read(), re.M), f"{line}: no make target {argv[1]}"
        return
    if exe == "source":
        assert argv[1] == ".venv/bin/activate", argv
        return
    name = exe[len(".venv/bin/"):] if exe.startswith(".venv/bin/") else exe
    assert os.path.exists(os.path.join(VENV_BIN, name)), f"{line}: {name} is not in the venv"
    files = [a for a in argv[1:] if re.match(r"^[\w.-]+/[\w./-]+\.(ya?ml|py|sh|json)$", a)]
    for f in files:
        assert os.path.exists(os.path.join(ROOT, f)) or _produced(f), f"{line}: {f} does not exist"
    if name == "python":
        script = argv[1]
        assert os.path.isfile(os.path.join(ROOT, script)), f"{line}: {script}"
        return
    if name == "msrun":
        assert any(a.endswith(".py") and os.path.isfile(os.path.join(ROOT, a)) for a in argv), argv
        return
    from hyperparallel.cli import build_parser
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"{line}: {' '.join(argv)}: arguments do not parse ({e})")
    if argv[1] in RUN_NOW and not any(_produced(f) for f in files) and not _reads_produced_data(argv):
        args = [a if not a.startswith(("out/", "runs/")) else str(tmp_path / os.path.basename(a)) for a in argv[1:]]
        p = subprocess.run([os.path.join(VENV_BIN, "hyperparallel"), *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"{line}: {' '.join(argv)}\n{p.stderr[-2000:]}"


def _anchors(doc: str) -> set:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces as ``-``)."""
    with open(os.path.join(ROOT, doc)) as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


LINKS = [(doc, target) for doc in DOCS
         for target in re.findall(r"\]\(([^)\s]+)\)", open(os.path.join(ROOT, doc)).read())
         if not target.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("doc,target", LINKS, ids=[f"{d}->{t}" for d, t in LINKS])
def test_doc_links_resolve(doc, target):
    """A relative link in README.md or docs/ names a file that exists and, with ``#anchor``, a heading of it."""
    path, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
    assert os.path.exists(os.path.join(ROOT, dest)), f"{doc}: link {target}: {dest} does not exist"
    if anchor:
        assert anchor in _anchors(dest), f"{doc}: link {target}: no heading #{anchor} in {dest}"
