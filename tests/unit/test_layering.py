"""The import graph of the package: layers only ever import downwards, and no two files import each other.

Layers, from the ground up (docs/layout.md, generated from ``LAYERS``, in :mod:`hyperparallel.testing`, by tools/layout.py): the algebra
(``mpipe``), the recipe front end (``recipe``), data (sources, the layout registry), models (one folder per family, each
holding its data layout: a family may import data, data never imports a model), the run config, the MindSpore
runtime (``runtime``), the front ends (CLI commands, bench, API, launcher). Every ``import`` of
every file counts, at module level or inside a function.
"""
import ast
import os

import pytest

from hyperparallel.testing import LAYERS, module_imports, package_modules   # tools/layout.py renders the same table

ROOT = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")), "hyperparallel")


MODULES = package_modules(ROOT)


GRAPH = {m: module_imports(m, p, MODULES) for m, p in MODULES.items()}


def _layer_key(module: str) -> str:
    """The package or top-level module of ``hyperparallel`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str):
    key = _layer_key(module)
    return key, LAYERS[key]


def test_every_module_has_a_layer_and_every_layer_a_module():
    """A new package or top-level module must be placed in LAYERS; a renamed or removed one leaves no stale
    entry (the import checks below would otherwise skip it or fail with a bare KeyError)."""
    found = {_layer_key(m) for m in MODULES}
    assert not found - set(LAYERS), f"modules without a layer: {sorted(found - set(LAYERS))}"
    assert not set(LAYERS) - found, f"layers naming no module: {sorted(set(LAYERS) - found)}"


def test_the_import_reader_sees_relative_and_function_level_imports():
    """The checks below pass on an empty graph: the reader must find what the CLI imports (``from .commands
    import plan`` at module level, ``from .recipe.recipe import COMPILE_MODES`` inside ``compile_flag``)."""
    assert {"hyperparallel.commands.plan", "hyperparallel.recipe.recipe"} <= GRAPH["hyperparallel.cli"]


def test_imports_point_down_the_layers():
    back = []
    for m, deps in GRAPH.items():
        mk, ml = _layer(m)
        for d in deps:
            dk, dl = _layer(d)
            if dl > ml:
                back.append(f"{m} (layer {mk}) imports {d} (layer {dk})")
    assert not back, "\n".join(sorted(back))


def test_no_import_cycles():
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("package", ["mpipe", "recipe"])
def test_algebra_and_recipe_front_end_name_no_model_or_runtime(package):
    """The pure layers never import MindSpore, the models, the data or the runtime (checked in the source)."""
    checked = [m for m in MODULES if m.split(".")[1:2] == [package]]
    assert len(checked) > 3, checked   # the package's modules are found, so the loop below checks something
    for m, p in MODULES.items():
        if m.split(".")[1:2] == [package]:
            tree = ast.parse(open(p).read(), p)
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            # absolute imports only: ``from .mindformers import ...`` is the recipe layer's own module
            names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
            assert not {x for x in names if x.split(".")[0] in ("mindspore", "mindformers", "mindone")}, m


def test_only_the_tests_and_tools_import_the_testing_module():
    """``hyperparallel.testing`` is the tests' and tools' shared scaffolding: no package module builds on it."""
    users = sorted(m for m, deps in GRAPH.items() if "hyperparallel.testing" in deps and m != "hyperparallel.testing")
    assert not users, users


# ---------------------------------------------------------------- bench: the launcher side and the rank side
BENCH_RANKS = "hyperparallel.bench.ranks"
BENCH_LAUNCHER = sorted(m for m in MODULES if m.startswith("hyperparallel.bench.") and not m.startswith(BENCH_RANKS))


def _absolute_imports(path: str) -> set:
    tree = ast.parse(open(path).read(), path)
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}


def test_bench_is_split_into_a_launcher_side_and_a_rank_side():
    """The modules of hyperparallel/bench/ run in the launcher and never import MindSpore, the runtime or the
    rank side (hyperparallel/bench/ranks/, what msrun runs), at module level or in a function; the rank side
    is what imports the runtime."""
    assert {"hyperparallel.bench.bench", "hyperparallel.bench.profile"} <= set(BENCH_LAUNCHER)
    for m in BENCH_LAUNCHER:
        bad = sorted(d for d in GRAPH[m] if d.startswith((BENCH_RANKS, "hyperparallel.runtime")))
        bad += sorted(x for x in _absolute_imports(MODULES[m]) if x.split(".")[0] in ("mindspore", "mindformers", "mindone"))
        assert not bad, f"{m} (the launcher side of bench) imports {bad}"
    assert any(d.startswith("hyperparallel.runtime") for d in GRAPH[BENCH_RANKS + ".worker"])


def test_the_launcher_side_of_bench_imports_without_mindspore():
    """What the launcher side imports at module level, transitively, needs no MindSpore (blocked here)."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['mindspore'] = None\n"
            + "".join(f"import {m}\n" for m in BENCH_LAUNCHER)
            + "print(sorted(m for m in sys.modules if m.startswith(('mindspore.', 'hyperparallel.runtime', "
              "'hyperparallel.bench.ranks'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(ROOT), env=dict(os.environ, PYTHONPATH=os.path.dirname(ROOT)))
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-2000:] + r.stdout

# ---------------------------------------------------------------- tools/ and tests/: tools never import tests
CHECKOUT = os.path.dirname(ROOT)
TEST_MODULES = {f[:-3] for _, _, fs in os.walk(os.path.join(CHECKOUT, "tests")) for f in fs if f.endswith(".py")}
TOOLS = sorted(f for f in os.listdir(os.path.join(CHECKOUT, "tools")) if f.endswith(".py"))


def _test_code_used(source: str, tools=frozenset()):
    """What of tests/ a tool's source imports: a module of tests/ (not also a tool's name), the ``tests``
    package, or tests/ put on ``sys.path``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path"):
            if any(isinstance(c, ast.Constant) and c.value == "tests" for a in node.args for c in ast.walk(a)):
                found.append("sys.path: tests/")
            continue
        else:
            continue
        top = {n.split(".")[0] for n in names}
        found += [n for n in top if n == "tests" or (n in TEST_MODULES and n not in tools)]
    return sorted(found)


def test_the_tools_reader_sees_test_imports():
    """The check below passes on a reader that finds nothing: it must find each way a tool reached tests/."""
    src = ('import sys, os\nsys.path.insert(0, os.path.join(ROOT, "tests"))\nfrom helpers import job_case\n'
           'def f():\n    import test_layering\n    from tests.helpers import ROOT\nimport doc_numbers\n')
    assert _test_code_used(src, {"doc_numbers"}) == ["helpers", "sys.path: tests/", "test_layering", "tests"]
    assert {"layout.py", "eight_ranks.py", "digest_cost.py"} <= set(TOOLS)
    assert {"helpers", "test_layering", "test_bench"} <= TEST_MODULES   # tests/, tests/unit/, tests/integration/


@pytest.mark.parametrize("tool", TOOLS)
def test_no_tool_imports_test_code(tool):
    """Tools may be run or imported by the tests, never the other way round: code both need lives in the
    package (:mod:`hyperparallel.testing`) or in tools/."""
    path = os.path.join(CHECKOUT, "tools", tool)
    used = _test_code_used(open(path).read(), {t[:-3] for t in TOOLS})
    assert not used, f"tools/{tool} imports test code: {used}"


# ---------------------------------------------------------------- tests/unit/ and tests/integration/
def _launches_msrun(path: str) -> bool:
    """A test module with a test marked ``msrun`` (``@pytest.mark.msrun``, or ``pytestmark``)."""
    tree = ast.parse(open(path).read(), path)
    return any(isinstance(n, ast.Attribute) and n.attr == "msrun" and ast.unparse(n.value) == "pytest.mark"
               for n in ast.walk(tree))


@pytest.mark.parametrize("kind", ["unit", "integration"])
def test_msrun_test_modules_are_in_integration_and_the_rest_in_unit(kind):
    """tests/unit/ launches no msrun job (``pytest tests/unit`` needs no ranks); each module of
    tests/integration/ has a test that does. No test module is left at the top of tests/."""
    folder = os.path.join(CHECKOUT, "tests", kind)
    mods = sorted(f for f in os.listdir(folder) if f.startswith("test_") and f.endswith(".py"))
    assert len(mods) > 10, mods
    wrong = [m for m in mods if _launches_msrun(os.path.join(folder, m)) != (kind == "integration")]
    assert not wrong, f"tests/{kind}/: {wrong}"
    assert not [f for f in os.listdir(os.path.join(CHECKOUT, "tests")) if f.startswith("test_")]
