"""What the tests and the tools share (the package itself never imports it): the layers of the import graph,
a job case of a recipe file, the 8-rank layouts, and the ranks of a 2-device job built in this process with
the checkpoint their own Saver writes. Here so that a tool (``tools/layout.py``, ``tools/eight_ranks.py``,
``tools/digest_cost.py``) uses exactly what a test uses without importing test code."""
from __future__ import annotations

import os

#: the layer of every package and top-level module of hyperparallel, from the ground up: an import only ever
#: points down or within its layer (tests/unit/test_layering.py checks it; tools/layout.py writes docs/layout.md)

def package_modules(root: str) -> dict:
    """{dotted module name: file path} of every module under the package folder ``root`` (``hyperparallel``)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def module_imports(name: str, path: str, modules) -> set:
    """The modules of ``modules`` that module ``name`` (file ``path``) imports, at module level or inside a
    function, as absolute names (``from . import x`` imports the submodule ``x`` only)."""
    import ast
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
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
            if node.module:
                found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in modules and m != name}


FRONT = 7
LAYERS = {"mpipe": 1, "recipe": 2, "tune": 2, "data": 3, "models": 4, "runconfig": 5, "watch": 5, "runtime": 6, "errors": 1,
          "commands": FRONT, "bench": FRONT, "cli": FRONT, "api": FRONT, "launch": FRONT, "util": FRONT, "runlock": FRONT, "fileio": 1,
          "testing": FRONT,
          "__main__": FRONT, "__init__": FRONT}

#: the layouts of the 8-rank launch (tests/integration/test_eight_ranks.py checks them, tools/eight_ranks.py times them):
#: name -> (schedule, overrides)
P8 = ("parallel_config.pipeline_stage=8", "parallel_config.micro_batch_num=8", "model.llm_layers=8",
      "mpipe.profile.regions.1.layers=8")
P4D2 = ("parallel_config.pipeline_stage=4", "parallel_config.data_parallel=2")
EIGHT_RANKS = {"p8_transpose": ("transpose", P8), "p8_1f1b": ("1f1b", P8), "p4_d2_transpose": ("transpose", P4D2)}


def job_case(tmp: str, recipe_path: str, schedule, name: str, overrides=(), steps: int = 3,
             chunks: str = "eager", **kw) -> dict:
    """One case of a worker job: the recipe (``--set`` overrides applied), its plan for ``schedule``,
    ``steps`` steps, losses and step-0 gradients dumped under ``tmp/dump/NAME``; ``kw`` adds job keys
    (``save_dir``, ``resume``, ``resume_from``, ``run_dir``, ...). ``chunks``: the ``mpipe.compile`` of a
    case whose overrides do not give one: ``eager`` for the suites about other things (no compile per
    chunk, shape and process); the equivalence suites ask for ``jit``, the default of a real run."""
    from hyperparallel.recipe import derive_recipe, load_recipe
    overrides = list(overrides)
    if not any(o.startswith("mpipe.compile=") for o in overrides):
        overrides.append(f"mpipe.compile={chunks}")
    if not any(o.startswith("train.optimizer_compile=") for o in overrides):
        # short cases: the optimizer's update op by op (bit-identical to its jit graph, which the
        # references keep), saving a ~1 s compile per case and rank
        overrides.append("train.optimizer_compile=eager")
    recipe = load_recipe(recipe_path, overrides=overrides)
    plan = derive_recipe(recipe, schedule)
    case = dict(name=name, raw=recipe.raw, plan=plan.to_json(), steps=steps, schedule=schedule,
                dump_dir=os.path.join(tmp, "dump", name))
    case.update(kw)
    return case



class FakeComm:
    """One rank of a 2-rank job, in this process (saving needs only barriers, which are no-ops here)."""

    def __init__(self, rank, D=1):
        self.rank, self.D, self.device, self.dp_index, self.world = rank, D, rank // D, rank % D, 2

    def ensure_groups(self, groups):
        pass

    def barrier(self):
        pass

    def send(self, *a):
        raise AssertionError("no communication in these tests")

    recv = all_reduce = broadcast = send


def in_process_ranks(recipe_path: str, schedule="transpose", overrides=()):
    """(recipe, plan, [(comm, chunks, optimizer, RankRuntime)] of every device), built one after the other in
    this process on CPU (needs MindSpore)."""
    from hyperparallel.recipe import derive_recipe
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.rank import RankRuntime
    compat.setup_device("CPU")
    recipe = load_parsed(recipe_path, list(overrides))
    plan = derive_recipe(recipe, schedule)
    rc = recipe.run
    out = []
    for d in range(plan.num_devices):
        rt = RankRuntime(plan, rc.model, rc.source(), rc.train, FakeComm(d))
        out.append((rt.comm, rt.chunks, rt.optimizer, rt))
    return recipe, plan, out


def write_checkpoint(recipe_path: str, save_dir, step, fmt="safetensors", schedule="transpose", overrides=()):
    """Step ``step`` of ``save_dir`` as the ranks' own :class:`Saver` writes it (its phases in turn, a no-op
    barrier between them); returns (the step's folder, the ranks)."""
    from hyperparallel.runtime import ckpt_files as cf
    from hyperparallel.runtime.checkpoint import recipe_hash
    recipe, plan, ranks = in_process_ranks(recipe_path, schedule, overrides)
    meta = {"recipe_hash": recipe_hash(recipe.raw), "schedule": schedule}
    savers = [rt.saver(save_dir, fmt, meta) for *_, rt in ranks]
    for phase in ("begin", "write", "finish"):   # Saver.save's phases, a barrier between them
        for s in savers:
            getattr(s, phase)(step)
    return cf.step_dir(save_dir, step), ranks
