"""One rank of a pipelined run: the single set-up and step loop that the msrun worker, the Python API
and the bench all use.

From a plan, a model adapter, a data source and the train settings, :class:`RankRuntime` creates the
plan's communication groups, builds this rank's chunks through the adapter, the interpreter (with the
caller's hooks), the optimizer, and the checkpoint saver and loader; :meth:`RankRuntime.step` runs
one optimizer step (the plan's next-step prologue before the first one). With a loss scale
(``runner_wrapper.scale_sense``, :mod:`.loss_scale`) the step seeds the backward with it, unscales the
gradients before the norm and clipping, and skips the update on every rank when they overflow.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from hyperparallel.data import DataSource
from hyperparallel.models import ModelAdapter
from hyperparallel.models.lora import is_frozen_base, trained
from hyperparallel.mpipe import ir
from hyperparallel.recipe.train import TrainConfig
from hyperparallel.runconfig import check_regions
from . import checkpoint, compiled, nonfinite, sharded
from .loss_scale import LossScale
from .hooks import Hooks
from .interpreter import Interpreter
from .optim import Optimizer, clip_scale, scaled, square_sum


def plan_groups(plan: ir.Plan):
    """Every communication group of the plan, as global-rank tuples (the layout of :mod:`.comm`): the replica
    groups of every data-parallel and tensor-parallel index, every device's data-parallel group of every
    tensor-parallel index, and every stage replica's tensor-parallel group (all ranks list all, in one order)."""
    D, T = plan.data_parallel, plan.tensor_parallel

    def rank(d, i, t):
        return (d * D + i) * T + t
    groups = set()
    for i in range(D):
        for t in range(T):
            for p in plan.programs.values():
                for a in p:
                    if a.group is not None and a.group != ir.DP_GROUP:
                        groups.add(tuple(sorted(rank(d, i, t) for d in a.group)))
    for d in range(plan.num_devices):
        for t in range(T):
            groups.add(tuple(rank(d, j, t) for j in range(D)))
        if T > 1:
            for i in range(D):
                groups.add(tuple(rank(d, i, t) for t in range(T)))
    return groups


def counted_params(plan: ir.Plan, chunks: dict, device: int, dp_index: int, tied: Optional[dict] = None,
                   tp_index: int = 0, sharded=None) -> set:
    """Names of the parameters this rank counts in the global gradient norm: those of the chunks whose
    first holder is this device, on data-parallel index 0 (a replicated encoder and every data-parallel
    copy hold the same gradients once all-reduced: each is counted once); a tied weight (``tied``: {label:
    parameter name} held here) only on the lowest device holding a copy (its copies' grads are summed).
    Tensor parallelism: a parameter split over the group (``sharded``: {name: spec}) counts on every tp index
    holding the first copy of its slice (:func:`.tensor_group.first_copy`), a whole copy only on tp index 0 (the
    copies' gradients are equal)."""
    from .tensor_group import first_copy
    first = {(c.region, c.index): min(c.devices) for c in plan.chunks}
    if dp_index != 0:
        return set()
    sharded, T = sharded or {}, plan.tensor_parallel

    def counts(name):
        return first_copy(sharded[name], T, tp_index) if name in sharded else tp_index == 0
    names = {p.name for key, cell in chunks.items() if first.get(key) == device for p in trained(cell.get_parameters())
             if counts(p.name)}
    for t in plan.tied_on(device):
        if device != min(t.devices):
            names.discard((tied or {}).get(t.name))
    return names


def tied_chunks_here(plan: ir.Plan, device: int) -> set:
    """The chunks of ``device`` holding a copy of a tied weight of which it holds two or more: built together
    from one network, so that the copies are one Parameter."""
    out = set()
    for t in plan.tied_on(device):
        here = {(t.region, c) for c in t.chunks if device in plan.chunk(t.region, c).devices}
        if len(here) > 1:
            out |= here
    return out


def plan_depths(plan: ir.Plan):
    """(name, layers) of every region of a plan, from its chunks, for :func:`check_regions`."""
    from types import SimpleNamespace
    return [SimpleNamespace(name=r, layers=max(c.stop for c in plan.chunks if c.region == r))
            for r in plan.regions()]


def parameters_line(counts, regions) -> str:
    """What trains, for the start banner: per region (``regions``, in data-flow order) its trainable and
    frozen parameter elements, from every rank's :meth:`RankRuntime.parameter_counts` (``counts``, merged by
    name: a replicated encoder or a data-parallel copy counts once), and the totals."""
    merged = {}
    for c in counts:
        merged.update(c)
    per = {r: [0, 0] for r in regions}
    for region, n, trained in merged.values():
        per.setdefault(region, [0, 0])[0 if trained else 1] += n
    trained, frozen = sum(t for t, _ in per.values()), sum(f for _, f in per.values())
    parts = [f"{r} " + " + ".join(([f"{t:,} trainable"] if t or not f else []) + ([f"{f:,} frozen"] if f else []))
             for r, (t, f) in per.items()]
    return f"parameters: {'; '.join(parts)}; in all {trained:,} trainable, {frozen:,} frozen"


@dataclass
class StepResult:
    """One optimizer step: the step loss (the same on every rank), this rank's gradients, and where
    the time went (the program, the optimizer update, the loss all-reduce; seconds)."""

    step: int
    loss: float
    grads: Dict[str, object]
    program_s: float
    optimizer_s: float
    loss_reduce_s: float
    grad_norm: float = 0.0   # global gradient norm before clipping (every parameter counted once)
    lr: float = 0.0          # the learning rate of this update
    compiles: int = 0        # graphs this rank compiled in this step (first calls of a new input shape)
    compile_s: float = 0.0   # their first calls' time (compile + one run), part of program_s
    stop: bool = False       # some rank asked to stop after this step (agreed by every rank)
    skipped: bool = False    # the loss or grad norm was not finite: no update (train.nonfinite: skip)
    loss_scale: float = 1.0  # the loss scale of this step (runner_wrapper.scale_sense; 1: none)
    overflow: bool = False   # loss scaling: the gradients overflowed: no update, a dynamic scale lowered

    @property
    def step_s(self) -> float:
        return self.program_s + self.optimizer_s + self.loss_reduce_s


class RankRuntime:
    """This rank's part of a pipelined model (see the module docstring).

    ``comm``: :class:`~.comm.Comm` under msrun, :class:`~.comm.LocalComm` for a one-device plan in
    one process; ``chunks``: prebuilt chunk Cells to share (default: built here by the adapter)."""

    def __init__(self, plan: ir.Plan, model: ModelAdapter, source: DataSource, train: TrainConfig, comm,
                 hooks: Optional[Hooks] = None, chunks: Optional[dict] = None, total_steps: Optional[int] = None,
                 compile: str = "jit", compile_fallback: str = "error", log=print,
                 pool: Optional[compiled.GraphPool] = None, pool_model: tuple = ()):
        check_regions(model, plan_depths(plan), where="plan")
        if comm.world != plan.ranks:
            raise RuntimeError(f"the plan needs {plan.ranks} ranks "
                               f"(pipeline_stage x data_parallel x model_parallel), this job has {comm.world}")
        self.plan, self.model, self.source, self.train, self.comm = plan, model, source, train, comm
        comm.ensure_groups(plan_groups(plan))
        if plan.tensor_parallel > 1 and chunks is None:   # the model splits its layers over the stage's T ranks
            from .tensor_group import TensorGroup
            model.shard(TensorGroup(comm))
        self.sharded = model.sharded_params() if plan.tensor_parallel > 1 else {}
        self.chunks = chunks if chunks is not None else {
            (c.region, c.index): model.build_chunk(c.region, c.start, c.stop) for c in plan.chunks_on(comm.device)}
        # each chunk's forward, compiled (mpipe.compile: jit) or eager; logged once per rank
        # (pool: compiled chunks kept from the earlier cases of this process, keyed by pool_model, the
        # (model section, data shapes, seed) the adapter was built from)
        self._pool = pool
        # (a tied weight's chunks on this rank stay this case's own: a kept chunk of another case's network
        # would hold another Parameter than this case's other copy)
        alone = tied_chunks_here(plan, comm.device)
        self._pool_keys = {(c.region, c.index): compiled.pool_key(*pool_model, c.region, c.start, c.stop)
                           for c in plan.chunks_on(comm.device)
                           if (c.region, c.index) not in alone} if pool is not None else None
        self.bodies = compiled.build_bodies(self.chunks, compile, compile_fallback, comm.rank, log,
                                            pool, self._pool_keys, model.compile_reason)
        self.chunks = {k: self.bodies[k].cell for k in self.chunks}   # a pooled Body brings its own Cell
        self.hooks = hooks or Hooks()
        self.interp = Interpreter(plan, comm, model, source, self.chunks, hooks, self.bodies,
                                  loss_normalization=getattr(train, "loss_normalization", "tokens"))
        split = {(a.region, a.chunk) for a in self.interp.program if a.kind == ir.W}
        if log is not None and self.bodies:
            log(compiled.describe(self.bodies, comm.rank, split))
        shards = sharded.shards_of(plan, self.interp, comm, train, total_steps or train.steps)
        if shards:   # ZeRO or transpose(optimizer=sharded): each shard steps with the rest, after clipping
            self.optimizer = sharded.ShardedOptimizer(self.interp.updated, shards, train, total_steps or train.steps)
            self.interp.scatter = self.optimizer.scatter   # ZeRO-2's REDUCESCATTER keeps this rank's shares
        else:
            self.optimizer = Optimizer(self.interp.updated, train, total_steps or train.steps)
        updated = {p.name for p in self.interp.updated}
        tp = getattr(comm, "tp_index", 0)
        self.counted = counted_params(plan, self.chunks, comm.device, comm.dp_index, self.interp.tied, tp,
                                      self.sharded) & updated
        # ZeRO-2: every data-parallel rank holds a different slice of the reduced gradients, each counted once
        # where data-parallel index 0 would count the whole parameter
        self.counted_shares = counted_params(plan, self.chunks, comm.device, 0, self.interp.tied, tp,
                                             self.sharded) & updated
        self.next_step = 0
        self._started = False
        self.steps_skipped = 0   # steps of this process without an update (train.nonfinite: skip, overflow)
        self.scaler = LossScale(getattr(train, "loss_scale", None))   # runner_wrapper.scale_sense

    @property
    def rank(self) -> int:
        return self.comm.rank

    def parameters(self) -> Dict[str, object]:
        """This rank's parameters by name (MindSpore Parameters)."""
        return {p.name: p for cell in self.chunks.values() for p in cell.get_parameters()}

    def parameter_counts(self) -> Dict[str, Tuple[str, int, bool]]:
        """This rank's parameters: name -> (region, elements of the whole parameter, trained: the region is
        trainable in the plan and the weight is no base weight LoRA froze).
        Gathered from every rank and merged by name (:func:`parameters_line`), each counts once."""
        import numpy as np
        from .tensor_group import whole_shape
        T = self.plan.tensor_parallel   # a sharded parameter's whole size (a padded vocabulary's unpadded)

        def whole(p):
            return int(np.prod(whole_shape(p.shape, self.sharded[p.name], T))) if p.name in self.sharded else int(p.size)
        return {p.name: (region, whole(p),
                         bool(self.plan.trainable.get(region, True)) and not is_frozen_base(p))
                for (region, _), cell in sorted(self.chunks.items()) for p in cell.get_parameters()}

    def step(self, step: Optional[int] = None, stop=False) -> StepResult:
        """Run optimizer step ``step`` (default: the next one) on this rank. ``stop``: this rank wants to stop
        after the step (a signal), a bool or a callable asked when the step's all-reduce starts (a signal
        that came while the step's programs ran still stops after this step); the wish rides on the
        step's all-reduce, so ``StepResult.stop`` is the same on every rank."""
        s = self.next_step if step is None else int(step)
        if not self._started:
            self.interp.run_prologue(s)   # next-step (spill) work of the first step; nothing for most plans
            self._started = True
        t0 = time.perf_counter()
        scale = self.scaler.value
        self.interp.loss_seed = scale   # the backward's seed on the last stage (loss scaling; 1: none)
        part = self.interp.run_step(s)
        if getattr(self.comm, "tp_index", 0):
            part = 0.0   # the T ranks of a stage compute the same loss: counted once
        grads = scaled(self.interp.step_grads(), 1.0 / scale)   # unscaled before the norm, clipping, the update
        t1 = time.perf_counter()
        # one all-reduce: the step loss, the global gradient norm's square (clipping needs it before
        # the update) and the stop wishes
        self.hooks.phase(s, "reduce")
        sq_local = square_sum([g for n, g in grads.items() if n in self.counted],
                              compiled=self.train.optimizer_compile != "eager")
        if self.interp.grad_shares:
            sq_local += self.optimizer.share_square(grads, self.counted_shares)
        wants = stop() if callable(stop) else stop
        loss, sq, stops = self.comm.all_reduce_values([part, sq_local, 1.0 if wants else 0.0])
        t2 = time.perf_counter()
        self.hooks.phase(s, "optimizer")
        norm = max(sq, 0.0) ** 0.5   # max keeps a NaN (no comparison with it is true)
        lr = self.optimizer.lr(s)
        bad = nonfinite.verdict(loss, norm)   # the same reduced numbers, so the same verdict, on every rank
        overflow = bool(bad) and self.scaler.on and nonfinite.finite(loss)
        if overflow:   # loss scaling: the gradients overflowed: no update on any rank, a dynamic scale goes down
            self.steps_skipped += 1
            self.scaler.update(False)
        elif bad:
            ranks = self._nonfinite_ranks(part, sq_local)
            if self.train.nonfinite != "skip":
                raise nonfinite.NonFiniteStep(s, bad, ranks)
            self.steps_skipped += 1
        else:
            self.optimizer.step(scaled(grads, clip_scale(norm, self.train.max_grad_norm)))
            self.scaler.update(True)
        t3 = time.perf_counter()
        self.next_step = s + 1
        new = [t for b in self.bodies.values() for t in b.take_new()]
        return StepResult(s, loss, grads, t1 - t0, t3 - t2, t2 - t1, norm, lr, len(new), sum(new), stop=stops > 0,
                          skipped=bool(bad), loss_scale=scale, overflow=overflow)

    def _nonfinite_ranks(self, part: float, sq_local: float) -> list:
        """The ranks whose own share of a non-finite step (loss part, counted gradients' square sum) was not
        finite (a collective: every rank calls it, as every rank has the same verdict)."""
        mine = not (nonfinite.finite(part) and nonfinite.finite(sq_local))
        return [r for r, bad in enumerate(self.comm.all_gather_object(mine)) if bad]

    def full_grads(self, grads: Dict[str, object]) -> Dict[str, object]:
        """A step's gradients (``StepResult.grads``) with ZeRO-2's shares gathered into whole gradients by
        parameter name (a collective over the data-parallel group: every rank calls it; for dumps)."""
        if any(n.startswith(sharded.SHARD) for n in grads):
            return self.optimizer.full_grads(grads)
        return grads

    @property
    def compile_mode(self) -> str:
        """``jit`` when every chunk of this rank runs compiled, ``eager`` when none does, else ``mixed``."""
        modes = {b.mode for b in self.bodies.values()}
        return modes.pop() if len(modes) == 1 else ("mixed" if modes else "eager")

    def compile_stats(self) -> list:
        """Per chunk of this rank: mode, why eager, compiles (distinct input shapes) and their time."""
        return [b.stats() for b in self.bodies.values()]

    # -- checkpoints --------------------------------------------------------------------------
    def saver(self, save_dir: str, fmt: str = "safetensors", meta: Optional[dict] = None,
              digests: bool = True) -> checkpoint.Saver:
        """The saver of this rank's part of ``SAVE_DIR/step_<N>/`` (``meta``: recipe hash, schedule,
        optimizer name for ``meta.json``, and the data's processor: where its tokenizer came from;
        ``digests``: record every file's SHA-256)."""
        meta = dict(meta or {})
        meta.setdefault("optimizer", self.train.optimizer)
        meta.setdefault("processor", self.model.processor_record(getattr(self.source, "cfg", None)))   # ckpt --export-hf
        return checkpoint.Saver(save_dir, self.comm, self.plan, self.chunks, self.optimizer, self.source, meta, fmt,
                                self.model.checkpoint_files(), digests=digests, tied=self.interp.tied,
                                loss_scale=self.scaler, sharded=self.sharded)

    def restore(self, src) -> Tuple[int, bool]:
        """Load checkpoint ``src`` (:class:`~.ckpt_files.Source`) by global name into this rank's chunks
        and optimizer; the data continue at its saved position. Returns (step, optimizer state loaded)
        and makes that step the next; CheckpointError if it does not fit."""
        step, with_state = checkpoint.restore_with_data(src, self.comm, self.chunks, self.optimizer, self.source,
                                                        self.model.checkpoint_name, self.sharded)
        self.scaler.load((src.meta or {}).get("loss_scale") or {})   # a dynamic scale continues where it was
        self.next_step, self._started = step, False
        return step, with_state

    def close(self) -> None:
        """Stop the data source's background work; give the compiled chunks back to the pool."""
        self.source.close()
        if self._pool is not None:
            self._pool.give_back(self._pool_keys, self.bodies)
            self._pool = None
