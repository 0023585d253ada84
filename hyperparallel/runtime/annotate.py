"""Graph-mode annotations: a plan's placement as ``cell.pipeline_stage`` + MindSpore/MindFormers config.

MindSpore's static-graph pipeline (semi-auto parallel, Ascend/GPU) places every operator on the
stage of the Cell it runs in and runs one of its built-in schedulers. For the plans whose
skeletons it can express, :func:`annotate` writes the plan's placement onto the model's cells and
returns the matching settings (:class:`GraphPipeline`); the pipe order's MindSpore scheduler comes
from the order registry (:data:`hyperparallel.mpipe.orders.ORDERS`). Transpose, ``place`` on a device
other than 0 and the orders no MindSpore scheduler runs are refused (:class:`GraphModeUnsupported`)
before any cell is touched. Cells are mapped to plan chunks by region and layer: a cell with
``region``, ``start`` and ``blocks`` attributes (the project's chunk cells), any cell whose
parameters all carry one ``REGION.LAYER.`` name prefix, or ``layer_of(name, cell)``; a parameter
whose owning cell is on another stage than its name asks for is listed in ``conflicts``. The
mapping table and its reasons: ``docs/mindformers.md`` ("What runs in graph mode"). On CPU these
annotations are produced and checked as data.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from hyperparallel.errors import SpecError
from hyperparallel.mpipe import orders
from hyperparallel.recipe.mindformers import offset_of


class GraphModeUnsupported(SpecError):
    """The plan's schedule has no MindSpore static-graph equivalent."""


@dataclass
class GraphPipeline:
    """MindSpore pipeline settings for a plan, and the stages written onto the model."""

    stages: int
    micro_batches: int
    interleave: bool
    virtual_stages: int
    scheduler: str
    data_parallel: int = 1
    cell_stages: Dict[str, int] = field(default_factory=dict)
    cell_segments: Dict[str, int] = field(default_factory=dict)  # zero_bubble_v: pipeline_segment per cell
    param_stages: Dict[str, int] = field(default_factory=dict)
    conflicts: List[str] = field(default_factory=list)
    frozen_regions: List[str] = field(default_factory=list)
    offset: object = 0   # model.model_config.offset giving MindFormers the plan's layers per chunk

    def pipeline_config(self) -> dict:
        """``parallel.pipeline_config`` / ``set_auto_parallel_context(pipeline_config=...)``."""
        return {"pipeline_interleave": self.interleave, "pipeline_scheduler": self.scheduler}

    def auto_parallel_pipeline_kwargs(self) -> dict:
        """Arguments of ``mindspore.parallel.auto_parallel.AutoParallel(...).pipeline``."""
        return {"stages": self.stages, "interleave": self.interleave, "scheduler": self.scheduler}

    def mindformers(self) -> dict:
        """The MindFormers sections (1.9 spelling: ``pp_interleave_num`` in ``model.model_config``)."""
        return {
            "parallel_config": {"data_parallel": self.data_parallel, "pipeline_stage": self.stages,
                                "micro_batch_num": self.micro_batches},
            "parallel": {"pipeline_config": self.pipeline_config()},
            "model": {"model_config": {"pp_interleave_num": self.virtual_stages, "offset": self.offset}},
        }


def _schedule_parts(plan) -> List[dict]:
    parts = list(plan.schedule or [])
    if not parts:
        raise SpecError("plan.schedule", "missing; derive the plan from a recipe (hyperparallel plan --export)")
    return parts


def graph_pipeline(plan) -> GraphPipeline:
    """The MindSpore/MindFormers pipeline settings for ``plan``; refuses what graph mode cannot run."""
    parts = _schedule_parts(plan)
    name = plan.meta.get("schedule_name", "?")
    recomputed = [p.get("region") for p in parts if p.get("recompute", "none") != "none"]
    if recomputed:
        raise GraphModeUnsupported(
            f"schedule.{recomputed[0]}.recompute", f"{name!r} recomputes {recomputed[0]!r} in the schedule (R "
            "actions, split chunks); the graph-mode annotations carry no recompute. Allowed in graph mode: none "
            "(give MindFormers' recompute_config to MindSpore instead), or run it with the PyNative runtime "
            "(hyperparallel train)")
    for part in parts[:-1]:
        sk = part.get("skeleton")
        if sk == "transpose":
            raise GraphModeUnsupported(
                "schedule", f"{name!r} transposes region {part.get('region')!r} (replicated on every pipeline "
                "stage, each micro-batch on its owner); MindSpore's static-graph pipeline gives each cell one "
                "pipeline_stage and cannot express it. Run it with the PyNative runtime: hyperparallel train RECIPE")
        if sk == "place" and int(part.get("device", 0)) != 0:
            raise GraphModeUnsupported(
                f"schedule.{part.get('region')}.device",
                f"place(device={part.get('device')}) feeds the first LLM stage (0) from a later stage; MindSpore's "
                "pipeline stages must not decrease along the data flow. Use device 0, or the PyNative runtime "
                "(hyperparallel train)")
        if sk not in ("place", "transpose"):
            raise GraphModeUnsupported(f"schedule.{part.get('region')}.skeleton", f"{sk!r} has no graph-mode form")
    body = parts[-1]
    order = body.get("order", plan.meta.get("order"))
    V = int(plan.meta.get("pp_interleave_num", 1))
    graph = [n for n, o in orders.ORDERS.items() if o.mindspore]
    entry = orders.ORDERS.get(order)
    if entry is None or entry.mindspore is None:
        why = entry.no_graph if entry is not None else "has no MindSpore scheduler"
        raise GraphModeUnsupported(
            "schedule.order", f"{order} {why}. Allowed in graph mode: {', '.join(graph)}; or run "
            f"{order} with the PyNative runtime (hyperparallel train)")
    sched, interleave = entry.mindspore
    frozen = [r for r, t in (plan.trainable or {}).items() if not t]
    body_chunks = sorted((c for c in plan.chunks if c.region == body.get("region")), key=lambda c: c.index)
    layers = [c.layers for c in body_chunks]
    offset = (offset_of(layers, plan.num_devices, V, zbv=order == "zbv")   # zbv: MindFormers reverses row 2
              if len(layers) == plan.num_devices * V else 0)
    return GraphPipeline(stages=plan.num_devices, micro_batches=plan.num_micro, interleave=interleave,
                         virtual_stages=V, scheduler=sched, data_parallel=int(plan.data_parallel or 1),
                         frozen_regions=frozen, offset=offset)


class _Placement:
    """(region, layer) -> pipeline stage, from the plan's chunks."""

    def __init__(self, plan):
        self.P = plan.num_devices
        self.chunks: Dict[str, list] = {}
        for c in plan.chunks:
            self.chunks.setdefault(c.region, []).append(c)
        for lst in self.chunks.values():
            lst.sort(key=lambda c: c.start)
        self.layers = {r: max(c.stop for c in lst) for r, lst in self.chunks.items()}
        self._re = re.compile(r"(?:^|\.)(" + "|".join(re.escape(r) for r in sorted(self.chunks, key=len,
                                                                                     reverse=True))
                              + r")\.(-?\d+)\.")

    def stage(self, region: str, layer: int) -> int:
        chunk = self.chunk(region, layer)
        if len(chunk.devices) != 1:
            raise GraphModeUnsupported("annotate", f"region {region!r} chunk {chunk.index} is on devices "
                                                   f"{list(chunk.devices)}; graph mode needs one stage per cell")
        return int(chunk.devices[0])

    def segment(self, region: str, layer: int) -> int:
        """``pipeline_segment`` of zero_bubble_v: 0 on the way down the V, 1 on the way back."""
        return self.chunk(region, layer).index // self.P

    def chunk(self, region: str, layer: int):
        lst = self.chunks.get(region)
        if not lst:
            raise SpecError("annotate", f"region {region!r} is not in the plan; plan regions: "
                                        f"{', '.join(self.chunks)}")
        n = self.layers[region]
        if layer < 0:
            chunk = lst[0]
        elif layer >= n:
            chunk = lst[-1]
        else:
            chunk = next(c for c in lst if c.start <= layer < c.stop)
        return chunk

    def of_param(self, name: str) -> Optional[Tuple[str, int]]:
        m = self._re.search(name)
        return (m.group(1), int(m.group(2))) if m else None


def _named_cells(model) -> List[Tuple[str, object]]:
    if isinstance(model, dict):
        roots = [(str(k), v) for k, v in model.items()]
    elif isinstance(model, (list, tuple)):
        roots = [(str(i), c) for i, c in enumerate(model)]
    else:
        roots = [("", model)]
    out = []
    for prefix, root in roots:
        for name, cell in root.cells_and_names():
            full = ".".join(p for p in (prefix, name) if p)
            out.append((full, cell))
    return out


def _own_params(cell):
    return [p for p in cell.get_parameters(expand=False)]


def annotate(model, plan, layer_of: Optional[Callable[[str, object], Optional[Tuple[str, int]]]] = None
             ) -> GraphPipeline:
    """Set ``cell.pipeline_stage`` on ``model``'s cells from ``plan``; return the pipeline settings.

    ``model``: a Cell, or a list/tuple/dict of Cells (e.g. ``model.build_full(cfg, seed)``).
    Raises :class:`GraphModeUnsupported` for schedules graph mode cannot run (transpose, zb_h1,
    interleaved_zb, dualpipev, place on a device other than 0) before touching any cell. With
    ``zbv`` each placed cell also gets ``pipeline_segment`` (0 or 1, its side of the V).
    """
    gp = graph_pipeline(plan)
    where = _Placement(plan)
    cells = _named_cells(model)
    stage_of_cell: Dict[int, int] = {}
    segment_of_cell: Dict[int, int] = {}
    for name, cell in cells:
        key = None
        if layer_of is not None:
            key = layer_of(name, cell)
        if key is None and all(hasattr(cell, a) for a in ("region", "start", "blocks")) \
                and isinstance(getattr(cell, "start"), int):
            region, start = cell.region, cell.start
            stage_of_cell[id(cell)] = where.stage(region, start)
            segment_of_cell[id(cell)] = where.segment(region, start)
            for i, blk in enumerate(cell.blocks):
                stage_of_cell[id(blk)] = where.stage(region, start + i)
                segment_of_cell[id(blk)] = where.segment(region, start + i)
            continue
        if key is None and id(cell) not in stage_of_cell:
            keys = {where.of_param(p.name) for p in cell.get_parameters()}
            if len(keys) == 1 and None not in keys:
                key = keys.pop()
        if key is not None:
            stage_of_cell[id(cell)] = where.stage(*key)
            segment_of_cell[id(cell)] = where.segment(*key)
    # Sub-cells of a stage-annotated cell that were not placed themselves inherit nothing
    # here: MindSpore takes an operator's stage from its innermost annotated cell.
    for name, cell in cells:
        s = stage_of_cell.get(id(cell))
        if s is None:
            continue
        cell.pipeline_stage = int(s)
        gp.cell_stages[name] = int(s)
        if gp.scheduler == "zero_bubble_v":
            cell.pipeline_segment = int(segment_of_cell[id(cell)])
            gp.cell_segments[name] = int(segment_of_cell[id(cell)])
    # Parameters: the stage their name asks for, versus the innermost annotated owner's.
    owner_stage: Dict[str, Tuple[str, Optional[int]]] = {}
    for name, cell in cells:  # outer cells first, so inner owners overwrite
        for p in _own_params(cell):
            owner_stage[p.name] = (name, stage_of_cell.get(id(cell)))
    for name, cell in cells:
        for p in cell.get_parameters():
            key = where.of_param(p.name)
            if key is None or p.name in gp.param_stages:
                continue
            want = where.stage(*key)
            gp.param_stages[p.name] = want
            owner, got = owner_stage.get(p.name, (name, None))
            if got is None:
                # no annotated owner: the innermost annotated ancestor decides
                anc = [(n, stage_of_cell[id(c)]) for n, c in cells
                       if id(c) in stage_of_cell and (owner == n or owner.startswith(n + ".") or n == "")]
                got = anc[-1][1] if anc else None
            if got != want:
                gp.conflicts.append(f"{p.name}: belongs on stage {want} (region {key[0]!r} layer {key[1]}), but "
                                    f"its operators run in cell {owner or '<root>'!r} on stage {got}; give that "
                                    "part its own Cell")
    return gp
