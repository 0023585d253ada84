"""A model family is one folder plus one registry line (docs/extending.md).

A family written here into a temporary package, with its own data layout, is refused by ``model.type``
until its package is listed in ``hyperparallel.models.FAMILIES``; with that one line it builds, its layout's
keys are read and checked, its source yields the micro-batches of the layout it reuses, and the
single-process reference trains it to the very losses of the model it derives from. A data source is one
file and one ``hyperparallel.data.TYPES`` line, the same way. The static half: no
module outside a family's folder imports it (the two named seams aside), and the data layer names no family.
"""
import ast
import os
import sys

import numpy as np
import pytest

import hyperparallel.models as models
from hyperparallel.data import formats
from hyperparallel.data.demo import write_demo
from hyperparallel.recipe import load_recipe
from hyperparallel.runconfig import RunConfig
from hyperparallel.testing import module_imports, package_modules

from helpers import ROOT

RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm_data.yaml")
PKG = "hp_demo_family"
FILES = {
    "__init__.py": '''"""A family outside the package: the tiny MLLM under another name, with its own data layout."""
from hyperparallel.data.formats import register
from hyperparallel.models.family import Family
from .format import LAYOUT

FAMILY = Family("demo_mllm", "hp_demo_family.adapter:DemoMLLM", types=("demo_mllm",))
register(LAYOUT)
''',
    "adapter.py": '''from hyperparallel.models.tiny_mllm.adapter import TinyMLLM


class DemoMLLM(TinyMLLM):
    family = "demo_mllm"

    def data_format(self):
        return dict(super().data_format(), format="demo_merge")
''',
    "format.py": '''from dataclasses import dataclass

from hyperparallel.data.formats import Layout
from hyperparallel.data.merge_index import KEYS
from hyperparallel.errors import SpecError, whole


@dataclass(frozen=True)
class DemoMerge:
    image_tokens: int
    name = "demo_merge"


def resolve(answer):
    return DemoMerge(whole("model.data_format().image_tokens", answer.get("image_tokens")))


def index(cfg, fmt, tok):
    from hyperparallel.data.merge_layout import MergeLayout
    return MergeLayout(cfg, fmt.image_tokens, tok)


def source(cfg, fmt, seed):
    from hyperparallel.data.conversations import ConversationsSource
    return ConversationsSource(cfg, fmt, seed)


def validate(cfg):
    if cfg.demo_scale <= 0:
        raise SpecError("data.demo_scale", f"must be > 0, got {cfg.demo_scale!r}")


LAYOUT = Layout("demo_merge", resolve, index, source, keys=KEYS + ("demo_scale",),
                defaults=lambda: {"demo_scale": 1}, validate=validate)
''',
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(str(tmp_path_factory.mktemp("demo")), 16, seed=1)


@pytest.fixture
def family_dir(tmp_path, monkeypatch):
    """The family's one folder, importable; the layout registry and sys.modules put back afterwards."""
    os.makedirs(tmp_path / PKG)
    for name, text in FILES.items():
        (tmp_path / PKG / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    layouts = dict(formats.LAYOUTS)
    yield tmp_path / PKG
    formats.LAYOUTS.clear()
    formats.LAYOUTS.update(layouts)
    for m in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[m]


def _raw(demo, model_type, extra=()):
    sets = [f"data.{k}={v}" for k, v in demo.items()] + [f"model.type={model_type}"] + list(extra)
    return load_recipe(RECIPE, overrides=sets).raw


def test_a_new_family_is_one_folder_and_one_registry_line(family_dir, demo, monkeypatch):
    assert sorted(os.listdir(family_dir)) == sorted(FILES)
    with pytest.raises(ValueError, match=r"^model.type: 'demo_mllm' unknown \(known: tiny_mllm; "):
        RunConfig.from_raw(_raw(demo, "demo_mllm"))
    monkeypatch.setattr(models, "FAMILIES", models.FAMILIES + (PKG,))   # the registry line
    rc = RunConfig.from_raw(_raw(demo, "demo_mllm"))
    assert type(rc.model).__name__ == "DemoMLLM" and rc.model.family == "demo_mllm"
    assert rc.data.demo_scale == 1   # the layout's own key, its default
    assert RunConfig.from_raw(_raw(demo, "demo_mllm", ["data.demo_scale=3"])).data.demo_scale == 3
    with pytest.raises(ValueError, match=r"^data.demo_scale: must be > 0, got 0$"):
        RunConfig.from_raw(_raw(demo, "demo_mllm", ["data.demo_scale=0"]))
    with pytest.raises(ValueError, match=r"^data.demo_scale: does not apply to this model's merge_index micro-batches"):
        RunConfig.from_raw(_raw(demo, "tiny_mllm", ["data.demo_scale=3"]))
    tiny = RunConfig.from_raw(_raw(demo, "tiny_mllm"))
    got, want = rc.source(), tiny.source()
    for step, micro in ((0, 0), (1, 3)):
        a, b = got.micro_batch(step, micro), want.micro_batch(step, micro)
        assert np.array_equal(a.text_ids, b.text_ids) and np.array_equal(a.merge_index, b.merge_index)
        assert np.array_equal(a.patches, b.patches)


def test_processor_files_come_through_the_adapter(demo, tmp_path):
    """``ckpt --export-hf``'s processor files: the runtime asks the adapter (``processor_record`` at save,
    ``write_processor`` at export); a family without processor files records none and says so at export."""
    tiny = RunConfig.from_raw(_raw(demo, "tiny_mllm"))
    assert tiny.model.processor_record(tiny.data) is None
    assert tiny.model.write_processor({"tokenizer": demo["tokenizer"]}, {"architectures": ["TinyMLLM"]},
                                      str(tmp_path)) == ([], "no processor is written for TinyMLLM (the tiny_mllm "
                                                             "adapter writes none)")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_the_new_family_trains_as_the_model_it_derives_from(family_dir, demo, monkeypatch):
    """The reference of the new family (its adapter, its layout's source) runs the tiny MLLM's steps."""
    from helpers import reference_run
    monkeypatch.setattr(models, "FAMILIES", models.FAMILIES + (PKG,))
    sets = [f"data.{k}={v}" for k, v in demo.items()]
    ours = reference_run(load_recipe(RECIPE, overrides=sets + ["model.type=demo_mllm"]), 2)[0]
    theirs = reference_run(load_recipe(RECIPE, overrides=sets), 2)[0]
    assert ours == theirs and ours[1] != ours[0]


# -- static: a family's modules stay in its folder ----------------------------------------------

PKG_ROOT = os.path.join(ROOT, "hyperparallel")
# modules outside a family's folder that import one of its modules, and why (none else may)
SEAMS = {}   # the runtime reaches a family only through its adapter (processor files: write_processor)


def test_no_module_outside_a_family_folder_imports_it():
    """Families are found through ``FAMILIES`` (by name, at run time), so an import of a family's module
    from outside its folder is a second place to touch when a family is added, moved or removed."""
    fams = [p for p in models.FAMILIES if p.startswith("hyperparallel.models.")]
    assert len(fams) == 3
    mods = package_modules(PKG_ROOT)
    found = set()
    for m, path in mods.items():
        deps = module_imports(m, path, mods)
        for fam in fams:
            if m == fam or m.startswith(fam + "."):
                continue
            mine = {d for d in deps if d == fam or d.startswith(fam + ".")}
            found |= {(m, d) for d in (mine - {fam} or mine)}   # ``from FAMILY import mod``: the module
    assert found == set(SEAMS), sorted(found ^ set(SEAMS))


def _code_strings(tree):
    """Identifiers and string constants of a module, docstrings left out."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.value
        elif isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr


def test_the_data_layer_names_no_family_and_no_family_layout():
    names = {f.name for f in models.families()} | (set(formats.LAYOUTS) - {formats.MERGE_INDEX})
    assert {"qwen_vl", "mf_llama", "tiny_mllm"} <= names
    hits = []
    for m, path in package_modules(PKG_ROOT).items():
        if m.startswith("hyperparallel.data"):
            for s in _code_strings(ast.parse(open(path).read(), path)):
                hits += [f"{m}: {s!r}" for n in names if n in s.lower()]
    assert not hits, "\n".join(hits)


# -- a data source: one file and one TYPES line ---------------------------------------------------

SOURCE = '''"""A data source outside the package: the synthetic generator's micro-batches under another type."""
from dataclasses import dataclass

from hyperparallel.data import DataSection
from hyperparallel.data.synthetic import DataConfig, SyntheticSource


@dataclass(frozen=True)
class ReplayConfig(DataSection):
    type = "replay"
    inner: DataConfig = None

    @classmethod
    def from_recipe(cls, section, raw):
        return cls(DataConfig.from_section(section))

    @property
    def micro_batch_size(self):
        return self.inner.micro_batch_size

    def shapes(self):
        return self.inner.shapes()

    def source(self, seed, data_format):
        return SyntheticSource(self.inner, seed)
'''


def test_a_new_data_source_is_one_file_and_one_registry_line(tmp_path, monkeypatch):
    import hyperparallel.data as data
    from hyperparallel.commands.data import precheck
    (tmp_path / "hp_demo_source.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
    raw = load_recipe(recipe, overrides=["data.type=replay"]).raw
    with pytest.raises(ValueError, match=r"^data.type: 'replay' unknown \(known: synthetic, conversations\)$"):
        RunConfig.from_raw(raw)
    monkeypatch.setitem(data.TYPES, "replay", "hp_demo_source:ReplayConfig")   # the registry line
    rc, want = RunConfig.from_raw(raw), RunConfig.from_raw(load_recipe(recipe).raw)
    assert type(rc.data).__name__ == "ReplayConfig" and rc.data.balance == "none"
    assert precheck(rc, recipe) == ("", None)   # no files to check before launch
    a, b = rc.source().micro_batch(2, 1), want.source().micro_batch(2, 1)
    assert np.array_equal(a.text_ids, b.text_ids) and np.array_equal(a.patches, b.patches)
    sys.modules.pop("hp_demo_source", None)
