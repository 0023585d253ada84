"""The package's layout as a Markdown table (docs/layout.md): the layers of ``tests/unit/test_layering.py`` (the
test that fails on an import pointing up; its table is ``hyperparallel.testing.LAYERS``), and for each
package or top-level module the first sentence of its docstring and its modules. Generated, so it cannot drift from the code or the test.

    python tools/layout.py
"""
from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "hyperparallel")


def layers() -> dict:
    """{top-level name: layer} as the layering test checks it (``hyperparallel.testing.LAYERS``)."""
    sys.path.insert(0, ROOT)
    from hyperparallel.testing import LAYERS
    return dict(LAYERS)


def summary(path: str) -> str:
    """The first sentence of a file's docstring (its first paragraph when no sentence ends in it)."""
    doc = ast.get_docstring(ast.parse(open(path).read(), path)) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    depth, end = 0, len(para)
    for i, c in enumerate(para):   # the first full stop outside parentheses, followed by a space
        depth += (c == "(") - (c == ")")
        if c == "." and depth == 0 and para[i + 1:i + 2] in (" ", ""):
            end = i
            break
    return para[:end].replace("``", "`").replace("|", "\\|")


def _modules(folder: str) -> list:
    """The modules of a package folder, a subpackage as ``name/ (its modules)``."""
    mods = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    subs = sorted(f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f, "__init__.py")))
    return mods + [f"{s}/ ({', '.join(_modules(os.path.join(folder, s)))})" for s in subs]


def rows():
    """(layer, name, summary, modules) for every package and top-level module the layering test names."""
    out = []
    for name, layer in layers().items():
        pkg, mod = os.path.join(PKG, name, "__init__.py"), os.path.join(PKG, name + ".py")
        if os.path.isfile(pkg):
            out.append((layer, f"`hyperparallel/{name}/`", summary(pkg), ", ".join(_modules(os.path.dirname(pkg)))))
        elif os.path.isfile(mod) and name not in ("__init__", "__main__"):
            out.append((layer, f"`hyperparallel/{name}.py`", summary(mod), ""))
    missing = {n for n in layers() if n not in ("__init__", "__main__")} - {r[1].strip("`").split("/")[1].split(".")[0]
                                                                          for r in out}
    if missing:
        raise SystemExit(f"tests/unit/test_layering.py names {sorted(missing)}, which hyperparallel/ does not have")
    return sorted(out, key=lambda r: (r[0], r[1]))


def main() -> int:
    print("| layer | package or module | what it is (its docstring) | modules |")
    print("|---|---|---|---|")
    for layer, name, what, mods in rows():
        print(f"| {layer} | {name} | {what} | {mods} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
