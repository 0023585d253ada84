"""The import graph of the package: layers only ever import downwards, and no two files import each other.

Layers, from the ground up (docs/layout.md, generated from ``LAYERS`` by tools/layout.py): the algebra
(``mpipe``), the recipe front end (``recipe``), data (sources, the layout registry), models (one folder per family, each
holding its data layout: a family may import data, data never imports a model), the run config, the MindSpore
runtime (``runtime``), the front ends (CLI commands, bench, API, launcher). Every ``import`` of
every file counts, at module level or inside a function.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hyperparallel")
FRONT = 7
LAYERS = {"mpipe": 1, "recipe": 2, "tune": 2, "data": 3, "models": 4, "runconfig": 5, "watch": 5, "runtime": 6, "errors": 1,
          "commands": FRONT, "bench": FRONT, "cli": FRONT, "api": FRONT, "launch": FRONT, "util": FRONT, "runlock": FRONT, "fileio": 1,
          "__main__": FRONT, "__init__": FRONT}


def _modules():
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


MODULES = _modules()


def _imports(name: str, path: str):
    """Project modules ``name`` imports (absolute names)."""
    is_pkg = path.endswith("__init__.py")
    package = name if is_pkg else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if node.module:   # "from . import x" imports the submodules only
                found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


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
    for m, p in MODULES.items():
        if m.split(".")[1:2] == [package]:
            tree = ast.parse(open(p).read(), p)
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            # absolute imports only: ``from .mindformers import ...`` is the recipe layer's own module
            names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
            assert not {x for x in names if x.split(".")[0] in ("mindspore", "mindformers", "mindone")}, m
