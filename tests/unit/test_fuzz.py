"""Fuzz: random mutations of the shipped recipes and of exported plans, run through the CLI in-process.

Every case must end without an uncaught exception, with exit status 0, 1 (checker findings, data
problems) or 2 (refused), a refusal as exactly one line ``error: FIELD: message`` naming a field,
and within :data:`CASE_S` seconds. Mutations: a value replaced by one of another type or out of
range (NaN, huge, negative, deep nesting), a key deleted, misspelt or added, a ``--set`` flag, and
text-level damage (a Latin-1 byte, a duplicated line, truncation, a tab).

CI runs a bounded number of examples (about a minute in all); the longer mode is one command:
``make fuzz`` (``HP_FUZZ_EXAMPLES=2000 python -m pytest -q tests/unit/test_fuzz.py``: 2,000 examples per fuzz test). A failure that
Hypothesis finds is kept below as an explicit regression case (``REGRESSIONS``).
"""
import contextlib
import io
import json
import os
import re
import time
import traceback

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperparallel import cli
from hyperparallel.recipe import derive_recipe, load_raw, load_recipe

from helpers import RECIPES

EXAMPLES = int(os.environ.get("HP_FUZZ_EXAMPLES", "0"))
CASE_S = 30.0
# fast recipes of every kind: the project's own, MindFormers configs (estimated costs), a data set
FUZZ_RECIPES = ("tiny_mllm.yaml", "llm_pipeline.yaml", "mllm_frozen_vit.yaml", "mf_llama_adamw.yaml",
                "tiny_mllm_mindformers.yaml", "tiny_mllm_data.yaml", "paper_8dev_qwen_vit.yaml")
COMMANDS = (["plan"], ["check"], ["simulate"], ["simulate", "--json"], ["data", "check"])
REFUSAL = re.compile(r"^error: [^\s:][^:]*: \S")


def _settings(default: int):
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=list(HealthCheck), database=None)


def run_main(argv):
    """(exit status, stdout, stderr, seconds) of ``hyperparallel ARGV`` in this process; an uncaught
    exception fails the test with the command and its traceback."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(list(argv))
    except SystemExit as e:   # argparse: a bad flag
        rc = e.code
    except BaseException:
        pytest.fail(f"uncaught exception for hyperparallel {' '.join(map(str, argv))}:\n{traceback.format_exc()}")
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def assert_clean(argv, expect_refusal: bool = False):
    rc, out, err, secs = run_main(argv)
    what = f"hyperparallel {' '.join(map(str, argv))}"
    assert secs < CASE_S, f"{what}: {secs:.1f} s"
    assert rc in (0, 1, 2), f"{what}: exit {rc}\n{err[-2000:]}"
    if rc == 2 and "usage:" not in err:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and REFUSAL.match(lines[0]), f"{what}: refusal is not one line naming a field:\n{err[-2000:]}"
        assert len(lines[0]) < 2200, f"{what}: a refusal of {len(lines[0])} characters"
    if expect_refusal:
        assert rc == 2, f"{what}: accepted (exit {rc})\n{out[-1000:]}"
    return rc, out, err


# -- the inputs -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory with a small demo data set at data/demo (the data recipe's relative paths)."""
    from hyperparallel.data.demo import write_demo
    root = tmp_path_factory.mktemp("fuzz")
    write_demo(str(root / "data" / "demo"), num_samples=8)
    return root


@pytest.fixture(scope="module")
def raws():
    return {name: load_raw(os.path.join(RECIPES, name)) for name in FUZZ_RECIPES}


@pytest.fixture(scope="module")
def plans():
    out = []
    for name, sched in (("tiny_mllm.yaml", None), ("llm_pipeline.yaml", None), ("tiny_mllm.yaml", "transpose(backward=central)"),
                        ("tiny_mllm.yaml", "1f1b(recompute=layers=1)")):
        out.append(derive_recipe(load_recipe(os.path.join(RECIPES, name)), sched).to_json())
    return out


def _paths(node, prefix=()):
    """Every (path) to a value of a nested dict/list tree."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _deep(n: int):
    v = 1
    for _ in range(n):
        v = [v]
    return v


WEIRD = st.one_of(
    st.integers(-3, 10), st.sampled_from([0, -1, -5, 2 ** 31, 2 ** 64, 10 ** 7, 3_000_000, 200_000]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([float("nan"), float("inf"), 1e308, -0.0, 0.5]),
    st.booleans(), st.none(), st.text(max_size=12), st.sampled_from(["", "one", "0", "1f1b", "transpose", "bogus"]),
    st.lists(st.one_of(st.integers(-2, 5), st.text(max_size=3)), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(-2, 5), max_size=2),
    st.integers(50, 300).map(_deep))


def _typo(key) -> str:
    k = str(key)
    return (k[:-1] if len(k) > 1 else k + "x") if k else "x"


def mutate_tree(draw, tree):
    """One mutation of a copy of ``tree`` (dict/list): replace a value, delete, misspell or add a key."""
    tree = json.loads(json.dumps(tree, default=str))
    paths = _paths(tree)
    if not paths:
        return tree
    path = draw(st.sampled_from(paths))
    parent = tree
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    op = draw(st.sampled_from(["value", "value", "value", "delete", "typo", "add", "wrap"]))
    if op == "value":
        parent[key] = draw(WEIRD)
    elif op == "delete":
        del parent[key]
    elif op == "typo" and isinstance(parent, dict):
        parent[_typo(key)] = parent.pop(key)
    elif op == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from([_typo(key), "bogus", "data_paralel"]))] = draw(WEIRD)
    elif op == "wrap":
        parent[key] = [parent[key]]
    return tree


def damage_text(draw, text: str) -> bytes:
    """Text-level damage of a YAML/JSON file (or none)."""
    data = text.encode()
    op = draw(st.sampled_from(["none", "none", "latin1", "dupline", "truncate", "tab"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if op == "latin1":
        return data[:at] + b"\xe9" + data[at:]
    if op == "truncate":
        return data[:at]
    if op == "tab":
        return data[:at] + b"\t" + data[at:]
    if op == "dupline":
        lines = data.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        return b"".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])
    return data


# -- the fuzz tests --------------------------------------------------------------------------------

@_settings(600)
@given(data=st.data())
@pytest.mark.slow
def test_mutated_recipes_are_refused_or_planned_cleanly(data, raws, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    name = data.draw(st.sampled_from(FUZZ_RECIPES))
    raw = mutate_tree(data.draw, raws[name])
    text = damage_text(data.draw, yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    path = workdir / f"fuzz_{name}"
    path.write_bytes(text)
    cmd = data.draw(st.sampled_from(COMMANDS if name == "tiny_mllm_data.yaml" else COMMANDS[:4]))
    assert_clean(cmd + [str(path)])


@_settings(300)
@given(data=st.data())
@pytest.mark.slow
def test_random_set_flags_are_refused_or_planned_cleanly(data, raws, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    name = data.draw(st.sampled_from(FUZZ_RECIPES))
    paths = [p for p in _paths(raws[name]) if all(isinstance(x, (str, int)) for x in p)]
    path = data.draw(st.sampled_from(paths))
    keys = ".".join(map(str, path))
    if data.draw(st.booleans()):
        keys = keys.rsplit(".", 1)[0] + "." + _typo(path[-1]) if "." in keys else _typo(keys)
    value = data.draw(st.one_of(st.sampled_from(["true", ".nan", "-.inf", "-5", "3000000", "[a, b, c]", "{x: 1}",
                                                 "", "'", "[[[[[[]]]]]]", "0.5", "null", "\u00e9"]),
                                st.text(max_size=10)))
    cmd = data.draw(st.sampled_from(COMMANDS if name == "tiny_mllm_data.yaml" else COMMANDS[:4]))
    assert_clean(cmd + [os.path.join(RECIPES, name), "--set", f"{keys}={value}"])


@_settings(800)
@given(data=st.data())
@pytest.mark.slow
def test_mutated_plans_are_refused_or_checked_cleanly(data, plans, workdir):
    obj = mutate_tree(data.draw, data.draw(st.sampled_from(plans)))
    text = damage_text(data.draw, json.dumps(obj))
    path = workdir / "fuzz_plan.json"
    path.write_bytes(text)
    assert_clean(["check", str(path)])


# -- regression cases: the probe's findings and what the fuzz found ---------------------------------

def _recipe_text(name):
    with open(os.path.join(RECIPES, name)) as f:
        return f.read()


REGRESSIONS = [
    # (file name and its bytes, or a shipped recipe (None: tiny_mllm.yaml) and None; the command and flags;
    # a 4th item: accepted is right, only no traceback is asked)
    ("latin1.yaml", b"# caf\xe9\n" + _recipe_text("tiny_mllm.yaml").encode(), ["plan"]),
    ("deep.yaml", ("foo: " + "[" * 20000 + "]" * 20000 + "\n" + _recipe_text("tiny_mllm.yaml")).encode(), ["plan"]),
    ("dup.yaml", ("device: CPU\n" + _recipe_text("tiny_mllm.yaml")).encode(), ["plan"]),
    ("bomb.yaml", ("a: &a [" + ",".join(["lol"] * 9) + "]\n"
                   + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcde", "bcdef"))
                   + _recipe_text("tiny_mllm.yaml")).encode(), ["plan"]),
    (None, None, ["plan", "--set", "parallel_config.micro_batch_num=3000000"]),
    (None, None, ["plan", "--set", "parallel_config.micro_batch_num=200000"]),
    (None, None, ["plan", "--set", "parallel_config.data_paralel=2"]),
    (None, None, ["plan", "--set", "parallel_config=[1, 2]"]),
    (None, None, ["plan", "--set", "mpipe.encoder.owners=bogus"]),
    (None, None, ["simulate", "--set", "mpipe.profile.regions.0.forward_ms=.nan"]),
    (None, None, ["simulate", "--set", "mpipe.profile.regions.0.forward_ms=.inf"]),
    (None, None, ["simulate", "--set", "mpipe.profile.regions.0.forward_ms=1e308"]),
    (None, None, ["simulate", "--steps", "1000000"]),
    (None, None, ["simulate", "--png", "."]),
    (None, None, ["simulate", "--trace", "no/such/folder/t.json"]),
    (None, None, ["plan", "--export", "."]),
    (None, None, ["plan", "--export", "no/such/folder/p.json"]),
    (None, None, ["plan", "--set", "train.seed=-5"]),
    # found by the fuzz test
    ("llm_pipeline.yaml", None, ["plan", "--set", "mpipe.profile.regions.0.name=[a, b, c]"]),   # TypeError
    (None, None, ["plan", "--set", "device=\x1f"]),   # yaml ReaderError outside the loader's try
    ("mf_llama_adamw.yaml", None, ["plan", "--set", "data.patch=[1, 2]"], "planned"),   # estimate: TypeError
    ("mf_llama_adamw.yaml", None, ["data", "check", "--set", "data.patch=[1, 2]"]),
    (None, None, ["data", "check", "--set", "model.vision_dim=.nan"]),   # ValueError in the model adapter
    (None, None, ["data", "check", "--set", "data.images_per_sample=[a]"]),   # numpy ValueError
]


@pytest.mark.parametrize("case", range(len(REGRESSIONS)))
def test_regressions_are_refused_in_one_line(case, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    name, text, argv = REGRESSIONS[case][:3]
    path = os.path.join(RECIPES, name or "tiny_mllm.yaml")
    if text is not None:
        path = str(workdir / name)
        with open(path, "wb") as f:
            f.write(text)
    at = 2 if argv[0] == "data" else 1
    rc, out, err = assert_clean(argv[:at] + [path] + argv[at:], expect_refusal=len(REGRESSIONS[case]) == 3)
    assert len(err) < 2200


def test_many_regions_are_linear(tmp_path):
    """1,000 regions (the bound) derive, check and simulate in seconds (the probe: 2,000 took 5.7 s and
    5,000 38 s, quadratic); 5,000 are refused naming the bound."""
    regs = [{"name": f"r{i}", "layers": 1} for i in range(4999)] + [{"name": "llm", "layers": 2}]
    raw = {"parallel_config": {"pipeline_stage": 2, "micro_batch_num": 2}, "mpipe": {"schedule": "1f1b",
                                                                                    "profile": {"regions": regs}}}
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(raw))
    rc, out, err, secs = run_main(["plan", str(path)])
    assert rc == 2 and "mpipe.profile.regions: 5000 is above the bound 1,000" in err
    raw["mpipe"]["profile"]["regions"] = regs[-1000:]
    path.write_text(yaml.safe_dump(raw))
    rc, out, err, secs = run_main(["simulate", str(path)])
    assert rc == 0 and secs < 10, (rc, err, secs)


@pytest.mark.parametrize("edit, field", [
    (lambda o: o["programs"]["0"][0].update(chunk=0.5), "plan programs.0[0].chunk"),        # was a KeyError
    (lambda o: o["programs"]["1"][0].update(peer="one"), "plan programs.1[0].peer"),        # was a TypeError
    (lambda o: o["programs"]["0"][0].update(micro="0"), "plan programs.0[0].micro"),        # named no field
    (lambda o: o["programs"]["0"][0].update(micro="two"), "plan programs.0[0].micro"),
    (lambda o: o["programs"]["0"][0].update(colour="red"), "plan programs.0[0].colour"),   # was OK
    (lambda o: o["chunks"][1].update(recompute="yes"), "plan chunks[1].recompute"),
    (lambda o: o.update(num_micro=float("nan")), "plan"),
])
def test_corrupted_plans_are_refused_naming_the_field(edit, field, plans, tmp_path):
    obj = json.loads(json.dumps(plans[0]))
    edit(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    rc, out, err = assert_clean(["check", str(path)], expect_refusal=True)
    assert err.startswith(f"error: {field}: {path}"), err
