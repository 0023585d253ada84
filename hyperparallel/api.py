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
built-in adapters a :class:`hyperparallel.data.MicroBatch`). A rank only reads
the micro-batches its program touches. ``step`` returns the step's loss (the mean over all
micro-batches, the same on every rank).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from .data import DataSource
from .mpipe import ir


def derive_plan(recipe_path: str, schedule: Optional[str] = None, overrides: Sequence[str] = ()) -> ir.Plan:
    """The checked plan of a recipe (its ``parallel_config`` and ``mpipe`` sections) for ``schedule``."""
    from .recipe import checked_plan
    from .runconfig import load_parsed
    return checked_plan(load_parsed(recipe_path, list(overrides)), schedule)


class _Feed(DataSource):
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

    def __init__(self, plan: ir.Plan, adapter, train=None, device: str = "CPU", compile: str = "jit",
                 compile_fallback: str = "error"):
        import os
        os.environ.setdefault("GLOG_v", "3")
        from .runtime import compat
        from .runtime.comm import Comm
        from .runtime.rank import RankRuntime
        from .recipe.train import TrainConfig

        adapter.check_device(device)
        compat.setup_device(device)
        self.plan, self.adapter = plan, adapter
        self.train = train or TrainConfig()
        self._feed = _Feed()
        comm = Comm(plan.data_parallel).with_data_parallel(plan.data_parallel, plan.tensor_parallel)
        self.rank_runtime = RankRuntime(plan, adapter, self._feed, self.train, comm,
                                        compile=compile, compile_fallback=compile_fallback)

    @classmethod
    def from_recipe(cls, path: str, schedule: Optional[str] = None, overrides: Sequence[str] = ()) -> "Runtime":
        """Model (its adapter), optimizer and plan from a recipe; SpecError/PlanError before any set-up."""
        from .recipe import checked_plan, refuse_over_memory_limit
        from .runconfig import load_parsed
        recipe = load_parsed(path, list(overrides))
        plan = checked_plan(recipe, schedule)
        refuse_over_memory_limit(recipe, plan)
        rc = recipe.run
        if rc.data.balance != "none":
            from .errors import SpecError
            raise SpecError("data.balance", f"{rc.data.balance}: Runtime.step trains the micro-batches it is given "
                                            "as they are (no data source to regroup); give data.balance: none")
        rt = cls(plan, rc.model, rc.train, rc.device, rc.compile, rc.compile_fallback)
        rt.recipe, rt.data = recipe, rc.data
        return rt

    # -- facts the script needs --------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.rank_runtime.rank

    @property
    def comm(self):
        return self.rank_runtime.comm

    @property
    def next_step(self) -> int:
        return self.rank_runtime.next_step

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step, over all data-parallel groups (the length of ``batch``)."""
        return self.plan.num_micro * max(1, self.plan.data_parallel)

    def parameters(self) -> Dict[str, object]:
        """This rank's parameters by name (MindSpore Parameters)."""
        return self.rank_runtime.parameters()

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
        return self.rank_runtime.step(s).loss

    def save(self, save_dir: str, fmt: str = "safetensors") -> str:
        """Checkpoint ``SAVE_DIR/step_<N>/`` in MindSpore's format (every rank calls it; see README
        "Checkpoints"). Returns the step directory."""
        from .runtime.checkpoint import recipe_hash
        from .runtime.ckpt_files import step_dir
        raw = getattr(getattr(self, "recipe", None), "raw", None) or {}
        meta = {"recipe_hash": recipe_hash(raw), "schedule": self.plan.meta.get("schedule_name")}
        self.rank_runtime.saver(save_dir, fmt, meta).save(self.next_step)
        return step_dir(save_dir, self.next_step)

    def load(self, path: str) -> int:
        """Restore a checkpoint (save directory: its newest complete step; a step directory; or a
        plain single-process MindSpore file); returns the step training continues from."""
        from .runtime.ckpt_files import resolve
        return self.rank_runtime.restore(resolve(path))[0]

    def close(self) -> None:
        """End of the script: wait for every rank (a peer's last send must not outlive its receiver)."""
        self.rank_runtime.close()
        self.comm.barrier()
