"""Python API: the pipeline runtime inside your own training script (launched with msrun).

::

    from hyperparallel.api import Runtime

    rt = Runtime.from_recipe("recipes/mf_llama_mllm.yaml", schedule="transpose")
    for step, batch in zip(range(100), my_batches()):   # batch: the step's micro-batches
        loss = rt.step(batch)
    rt.save("ckpt")
    rt.close()

or, for your own MindSpore model, ``Runtime(plan, adapter, train=TrainConfig(...))`` with an
adapter you wrote (:class:`hyperparallel.models.ModelAdapter`) and a plan from
:func:`derive_plan`. Every rank runs the same script and passes the same ``batch``: a
sequence of the step's ``num_micro x data_parallel`` micro-batches (global index
``dp_index * num_micro + m``), each whatever your adapter's ``tensors()`` reads (for the
built-in adapters a :class:`hyperparallel.mindspore.data.MicroBatch`). A rank only reads
the micro-batches its program touches. ``step`` returns the step's loss (the mean over all
micro-batches, the same on every rank).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from .mpipe import ir


def derive_plan(recipe_path: str, schedule: Optional[str] = None, overrides: Sequence[str] = ()) -> ir.Plan:
    """The checked plan of a recipe (its ``parallel_config`` and ``mpipe`` sections) for ``schedule``."""
    from .mpipe.check import assert_valid
    from .mpipe.derive import derive_recipe
    from .mpipe.recipe import load_recipe
    return assert_valid(derive_recipe(load_recipe(recipe_path, list(overrides)), schedule))


# -- checkpoints: MindSpore step directories by global name (hyperparallel.mindspore.checkpoint) --

def save_checkpoint(runtime: "Runtime", save_dir: str, fmt: str = "safetensors") -> str:
    """Write ``SAVE_DIR/step_<N>/`` (N = steps done); every rank calls it. Returns the step directory."""
    from .mindspore import checkpoint
    case = {"save_dir": save_dir, "raw": getattr(getattr(runtime, "recipe", None), "raw", {}) or {},
            "schedule": runtime.plan.meta.get("schedule_name")}
    checkpoint.Saver(case, runtime.comm, runtime.plan, runtime.chunks, runtime.optimizer, fmt).save(runtime.next_step)
    return checkpoint.step_dir(save_dir, runtime.next_step)


def load_checkpoint(runtime: "Runtime", path: str) -> int:
    """Load the newest complete step of a save directory, a step directory or a single-process
    MindSpore checkpoint file into this rank's chunks; returns the step training continues from."""
    from .mindspore import checkpoint
    from .mindspore.ckpt_files import resolve
    step, _ = checkpoint.restore(resolve(path), runtime.comm, runtime.chunks, runtime.optimizer)
    return step


class _Feed:
    """Data source of the interpreter: the micro-batches given to :meth:`Runtime.step`."""

    def __init__(self):
        self.batches: Dict[int, Sequence] = {}

    def micro_batch(self, step: int, micro: int):
        if step not in self.batches:
            raise RuntimeError(f"the plan needs step {step}'s micro-batches (a next-step spill plan: "
                               f"pass next_batch= to Runtime.step)")
        return self.batches[step][micro]


class Runtime:
    """This rank's part of a pipelined model: chunks, program, optimizer (see module docstring)."""

    def __init__(self, plan: ir.Plan, adapter, train=None, device: str = "CPU"):
        import os
        os.environ.setdefault("GLOG_v", "3")
        from .mindspore import compat
        from .mindspore.comm import Comm
        from .mindspore.config import TrainConfig, check_regions
        from .mindspore.interpreter import Interpreter
        from .mindspore.optim import Optimizer
        from .mindspore.worker import create_groups, plan_regions

        check_regions(adapter, plan_regions(plan), where="plan")
        adapter.check_device(device)
        compat.setup_device(device)
        self.plan, self.adapter = plan, adapter
        self.train = train or TrainConfig()
        self.comm = Comm(plan.data_parallel)
        if self.comm.world != plan.num_devices * plan.data_parallel:
            raise RuntimeError(f"the plan needs {plan.num_devices * plan.data_parallel} ranks "
                               f"(pipeline_stage x data_parallel), msrun started {self.comm.world}")
        create_groups(plan, self.comm)
        self.chunks = {(c.region, c.index): adapter.build_chunk(c.region, c.start, c.stop)
                       for c in plan.chunks_on(self.comm.device)}
        self._feed = _Feed()
        self.interp = Interpreter(plan, self.comm, adapter, self._feed, self.chunks)
        self.optimizer = Optimizer(self.interp.updated, self.train)
        self.next_step = 0
        self._started = False

    @classmethod
    def from_recipe(cls, path: str, schedule: Optional[str] = None, overrides: Sequence[str] = ()) -> "Runtime":
        """Model (its adapter), optimizer and plan from a recipe; SpecError/PlanError before any set-up."""
        from .mindspore.config import run_config_of
        from .mpipe.check import assert_valid
        from .mpipe.derive import derive_recipe
        from .mpipe.recipe import load_recipe
        recipe = load_recipe(path, list(overrides))
        rc = run_config_of(recipe)
        rt = cls(assert_valid(derive_recipe(recipe, schedule)), rc.model, rc.train, rc.device)
        rt.recipe, rt.data = recipe, rc.data
        return rt

    # -- facts the script needs --------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step, over all data-parallel groups (the length of ``batch``)."""
        return self.plan.num_micro * max(1, self.plan.data_parallel)

    def parameters(self) -> Dict[str, object]:
        """This rank's parameters by name (MindSpore Parameters)."""
        return {p.name: p for cell in self.chunks.values() for p in cell.get_parameters()}

    # -- training ---------------------------------------------------------------------------
    def step(self, batch: Sequence, next_batch: Optional[Sequence] = None) -> float:
        """One optimizer step over ``batch`` (the step's micro-batches); returns the step loss."""
        if len(batch) != self.micro_batches:
            raise ValueError(f"batch: {len(batch)} micro-batches, the plan needs {self.micro_batches} "
                             f"(micro_batch_num x data_parallel)")
        s = self.next_step
        self._feed.batches = {s: batch}
        if next_batch is not None:
            self._feed.batches[s + 1] = next_batch
        if not self._started:
            self.interp.run_prologue(s)   # next-step (spill) work of the first step, if the plan has any
            self._started = True
        part = self.interp.run_step(s)
        self.optimizer.step(self.interp.step_grads())
        self.next_step = s + 1
        return self.comm.all_reduce_scalar(part)

    def save(self, save_dir: str, fmt: str = "safetensors") -> str:
        """Checkpoint ``SAVE_DIR/step_<N>/`` in MindSpore's format (every rank calls it; see README
        "Checkpoints"). Returns the step directory."""
        return save_checkpoint(self, save_dir, fmt)

    def load(self, path: str) -> int:
        """Restore a checkpoint (save directory: its newest complete step; a step directory; or a
        plain single-process MindSpore file); returns the step training continues from."""
        got = load_checkpoint(self, path)
        self.next_step, self._started = got, False
        return got

    def close(self) -> None:
        """End of the script: wait for every rank (a peer's last send must not outlive its receiver)."""
        self.comm.barrier()
