"""Program IR: the per-device action lists that every consumer reads.

A :class:`Plan` is the single source of schedule truth. The checker, the cost
model, the timeline drawer and the MindSpore runtime all walk ``plan.programs``
and nothing else. Actions are small frozen dataclasses; a plan round-trips
through JSON of the form ``{"programs": {"0": [{"kind": "F", ...}], ...}}``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import bounds
from ..errors import SpecError, unknown_key, whole

# Compute kinds run on the compute lane.
F = "F"      # forward of (region, chunk, micro)
B = "B"      # input-grad backward (zero-bubble split)
W = "W"      # weight-grad backward (zero-bubble split)
BW = "BW"    # fused backward: input grad and weight grad together
R = "R"      # recompute forward with the tape: a central backward's, or a recomputed chunk's (:mod:`.recompute`)
# Communication kinds run on the comm lane.
SEND = "SEND"
RECV = "RECV"
ALLREDUCE = "ALLREDUCE"
BROADCAST = "BROADCAST"
ALLGATHER = "ALLGATHER"   # sharded optimizer of a replicated region: update this device's share, gather all
REDUCESCATTER = "REDUCESCATTER"   # ZeRO-2: sum the grads over the data-parallel group, keep this rank's share

COMPUTE_KINDS = (F, B, W, BW, R)
BACKWARD_KINDS = (B, W, BW, R)
P2P_KINDS = (SEND, RECV)
COLLECTIVE_KINDS = (ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER)
ALL_KINDS = COMPUTE_KINDS + P2P_KINDS + COLLECTIVE_KINDS

# Tensor names carried by SEND/RECV/collectives.
ACT = "act"          # output activation of (region, chunk, micro)
GRAD = "grad"        # gradient w.r.t. that output (flows to the producer's backward)
WGRAD = "wgrad"      # weight gradients of a region (all-reduce over replicas)
WEIGHTS = "weights"  # parameters of a region (broadcast from the central device, or gathered from the shards)
TIED = "tied"        # gradients of a tied weight (all-reduce over the devices holding a copy)

DP_GROUP = "dp"      # the data-parallel group of a pipeline device (outside the plan)


@dataclass(frozen=True)
class Action:
    """One step of one device's program.

    ``region``/``chunk``/``micro`` name the compute task, or for SEND/RECV the
    task whose output (``tensor == "act"``) or output-gradient (``"grad"``) moves.
    ``peer`` is the other device of a SEND/RECV; ``group`` the member devices of
    a collective (or ``"dp"`` for the data-parallel group); ``root`` the source
    of a broadcast. ``step`` is 1 for work done ahead for the next optimizer step
    (next-step spill), else 0. ``pair``: the forward and the input-grad of two micro-batches
    with the same pair id on one device may run overlapped on a backend that can (DualPipeV);
    program order is a valid sequential order, and this runtime runs them one after the other.
    """

    kind: str
    region: Optional[str] = None
    chunk: Optional[int] = None
    micro: Optional[int] = None
    peer: Optional[int] = None
    tensor: Optional[str] = None
    group: Optional[Tuple[int, ...]] = None
    root: Optional[int] = None
    step: int = 0
    pair: Optional[int] = None

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_backward(self) -> bool:
        """Backward footprint: backward compute and the gradient messages feeding it."""
        return self.kind in BACKWARD_KINDS or (self.kind in P2P_KINDS and self.tensor == GRAD)

    def to_json(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            if f.name == "kind":
                continue
            v = getattr(self, f.name)
            if v is None or (f.name == "step" and v == 0):
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @staticmethod
    def from_json(obj: dict, where: str = "action") -> "Action":
        """The action of a plan JSON object; every key checked (a SpecError naming ``where.key``)."""
        if not isinstance(obj, dict) or "kind" not in obj:
            raise SpecError(where, f"must be an object with a 'kind', got {_short(obj)}")
        if obj["kind"] not in ALL_KINDS:
            raise SpecError(f"{where}.kind", f"{_short(obj['kind'])} unknown; allowed: {', '.join(ALL_KINDS)}")
        known = [f.name for f in fields(Action)]
        if set(obj) - set(known):
            raise unknown_key(where, obj, known)
        kw = dict(obj)
        for k in ("chunk", "micro", "peer", "root", "pair", "step"):
            if kw.get(k) is not None:
                _index(f"{where}.{k}", kw[k])
        for k in ("region", "tensor"):
            if kw.get(k) is not None and not isinstance(kw[k], str):
                raise SpecError(f"{where}.{k}", f"must be a string, got {_short(kw[k])}")
        if kw.get("tensor") is not None and kw["tensor"] not in TENSORS:
            raise SpecError(f"{where}.tensor", f"{kw['tensor']!r} unknown; allowed: {', '.join(TENSORS)}")
        group = kw.get("group")
        if group is not None:
            if isinstance(group, str):
                if group != DP_GROUP:
                    raise SpecError(f"{where}.group", f"{group!r} unknown; allowed: {DP_GROUP!r} or a list of devices")
            elif isinstance(group, list):
                kw["group"] = tuple(_index(f"{where}.group[{i}]", g) for i, g in enumerate(group))
            else:
                raise SpecError(f"{where}.group", f"must be a list of device indices or {DP_GROUP!r}, got "
                                                  f"{_short(group)}")
        return Action(**kw)

    def label(self) -> str:
        """Short human name, e.g. ``F llm c1 m3`` or ``SEND act vision c0 m2 ->0``."""
        parts = [self.kind]
        if self.tensor and (self.kind in P2P_KINDS or self.tensor == TIED):
            parts.append(self.tensor)
        if self.region is not None:
            parts.append(self.region)
        if self.chunk is not None:
            parts.append(f"c{self.chunk}")
        if self.micro is not None:
            parts.append(f"m{self.micro}")
        if self.step:
            parts.append(f"(step+{self.step})")
        if self.kind == SEND:
            parts.append(f"->{self.peer}")
        elif self.kind == RECV:
            parts.append(f"<-{self.peer}")
        elif self.group is not None:
            parts.append(f"group={self.group if isinstance(self.group, str) else list(self.group)}")
        return " ".join(parts)


class RegionList(list):
    """Region names in data-flow order; ``index`` by a map built once (a lookup per action must not
    scan the list: plans of thousands of regions would grow with the square of the count)."""

    def index(self, name, *args):
        if args:
            return super().index(name, *args)
        pos = self.__dict__.get("_pos")
        if pos is None or len(pos) != len(self):
            pos = self.__dict__["_pos"] = {r: i for i, r in enumerate(self)}
        if name not in pos:
            raise ValueError(f"{name!r} is not in list")
        return pos[name]


def needs_backward(regions: Sequence[str], trainable: Mapping[str, bool]) -> Dict[str, bool]:
    """Per region: some region up to and including it is trainable (its backward must run)."""
    out, any_so_far = {}, False
    for r in regions:
        any_so_far = any_so_far or bool(trainable[r])
        out[r] = any_so_far
    return out


def prev_chunk(regions: Sequence[str], nchunks: Mapping[str, int], region: str,
               chunk: int) -> Optional[Tuple[str, int]]:
    """The chunk whose output feeds ``(region, chunk)``: the previous chunk of the region, or the
    last chunk of the previous region; ``None`` for the first chunk of the first region (data)."""
    if chunk > 0:
        return region, chunk - 1
    i = regions.index(region)
    return None if i == 0 else (regions[i - 1], nchunks[regions[i - 1]] - 1)


def next_chunk(regions: Sequence[str], nchunks: Mapping[str, int], region: str,
               chunk: int) -> Optional[Tuple[str, int]]:
    """The chunk that consumes ``(region, chunk)``'s output; ``None`` after the last chunk (loss)."""
    if chunk < nchunks[region] - 1:
        return region, chunk + 1
    i = regions.index(region)
    return None if i == len(regions) - 1 else (regions[i + 1], 0)


@dataclass(frozen=True)
class Chunk:
    """A contiguous layer range ``[start, stop)`` of a region, and the devices holding it.

    ``recompute``: its forward keeps only its input and an ``R`` runs it again, with the tape, before
    its backward (:mod:`.recompute`)."""

    region: str
    index: int
    start: int
    stop: int
    devices: Tuple[int, ...]
    recompute: bool = False

    @property
    def layers(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Tied:
    """A tied weight of a plan: one logical parameter whose copies are held by ``chunks`` of ``region``
    on ``devices`` (ascending). With two or more devices the plan sums its gradients over them (an
    ALLREDUCE of tensor ``tied``) before the optimizer; on one device the copies are one parameter."""

    name: str
    region: str
    chunks: Tuple[int, ...]
    devices: Tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "region": self.region, "chunks": list(self.chunks), "devices": list(self.devices)}


@dataclass
class Plan:
    """Derived placement and per-device programs for one optimizer step."""

    num_devices: int
    num_micro: int
    programs: Dict[int, List[Action]]
    chunks: List[Chunk] = field(default_factory=list)
    schedule: List[dict] = field(default_factory=list)
    trainable: Dict[str, bool] = field(default_factory=dict)
    data_parallel: int = 1
    meta: dict = field(default_factory=dict)
    tied: List[Tied] = field(default_factory=list)

    @property
    def tensor_parallel(self) -> int:
        """T, the tensor-parallel ranks of each stage replica (``meta["tensor_parallel"]``, from the recipe's
        ``parallel_config.model_parallel``; every one of them runs its device's program)."""
        return int(self.meta.get("tensor_parallel", 1) or 1)

    @property
    def ranks(self) -> int:
        """The job's ranks: P x D x T."""
        return self.num_devices * self.data_parallel * self.tensor_parallel

    def tied_on(self, device: int) -> List[Tied]:
        """The tied weights a device holds a copy of."""
        return [t for t in self.tied if device in t.devices]

    def chunk(self, region: str, index: int) -> Chunk:
        for c in self.chunks:
            if c.region == region and c.index == index:
                return c
        raise KeyError(f"no chunk {index} of region {region!r}")

    def prologue(self, device: int) -> List[Action]:
        """What a device runs once before its first step: its next-step (``step=1``) actions, in order.

        A step's program does next-step work (spill) for the following step; the very first
        step's share of that work is done by this prologue, so every step finds it done.
        """
        return [a for a in self.programs.get(device, []) if a.step]

    def chunks_on(self, device: int) -> List[Chunk]:
        return [c for c in self.chunks if device in c.devices]

    def regions(self) -> List[str]:
        return RegionList(dict.fromkeys(c.region for c in self.chunks))

    def to_json(self) -> dict:
        return {
            "num_devices": self.num_devices,
            "num_micro": self.num_micro,
            "data_parallel": self.data_parallel,
            "schedule": self.schedule,
            "trainable": self.trainable,
            "chunks": [
                {"region": c.region, "index": c.index, "start": c.start, "stop": c.stop,
                 "devices": list(c.devices), **({"recompute": True} if c.recompute else {})} for c in self.chunks
            ],
            "meta": self.meta,
            **({"tied": [t.to_json() for t in self.tied]} if self.tied else {}),
            "programs": {str(d): [a.to_json() for a in prog] for d, prog in sorted(self.programs.items())},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @staticmethod
    def from_json(obj: dict) -> "Plan":
        """The plan of a JSON object as :meth:`to_json` writes it; every value's type and size checked
        (a :class:`SpecError` naming the field, e.g. ``programs.0[3].chunk``; bounds in :mod:`.bounds`)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("programs"), dict):
            raise SpecError("programs", "plan JSON must be an object with a 'programs' object")
        if set(obj) - set(PLAN_KEYS):
            raise unknown_key("", obj, PLAN_KEYS)
        n_actions = 0
        programs: Dict[int, List[Action]] = {}
        for d, prog in obj["programs"].items():
            if not (isinstance(d, str) and d.isdigit() and d.isascii()):
                raise SpecError(f"programs.{d}", "a program's key must be its device index (0, 1, ...)")
            dev = bounds.at_most(f"programs.{d}", int(d), bounds.MAX_PIPELINE_STAGE - 1, "(device index)")
            if not isinstance(prog, list):
                raise SpecError(f"programs.{d}", f"must be a list of actions, got {_short(prog)}")
            n_actions += len(prog)
            if n_actions > bounds.MAX_PLAN_ACTIONS:
                raise SpecError("programs", f"more than {bounds.MAX_PLAN_ACTIONS:,} actions (bound)")
            programs[dev] = [Action.from_json(a, f"programs.{d}[{i}]") for i, a in enumerate(prog)]
        chunks_obj = obj.get("chunks", [])
        if not isinstance(chunks_obj, list):
            raise SpecError("chunks", f"must be a list, got {_short(chunks_obj)}")
        chunks = []
        for i, c in enumerate(chunks_obj):
            w = f"chunks[{i}]"
            keys = ("region", "index", "start", "stop", "devices")
            if not isinstance(c, dict):
                raise SpecError(w, f"must be an object with {', '.join(keys)}")
            if set(c) - {"recompute"} != set(keys):
                missing = [k for k in keys if k not in c]
                if missing:
                    raise SpecError(f"{w}.{missing[0]}", "missing")
                raise unknown_key(w, c, keys + ("recompute",))
            if not isinstance(c.get("recompute", False), bool):
                raise SpecError(f"{w}.recompute", f"must be true or false, got {_short(c['recompute'])}")
            if not isinstance(c["region"], str):
                raise SpecError(f"{w}.region", f"must be a string, got {_short(c['region'])}")
            if not isinstance(c["devices"], list):
                raise SpecError(f"{w}.devices", f"must be a list of device indices, got {_short(c['devices'])}")
            chunks.append(Chunk(c["region"], _index(f"{w}.index", c["index"]), _index(f"{w}.start", c["start"]),
                                _index(f"{w}.stop", c["stop"]),
                                tuple(_index(f"{w}.devices[{j}]", x) for j, x in enumerate(c["devices"])),
                                c.get("recompute", False)))
        micro = [a.micro for p in programs.values() for a in p if a.micro is not None]
        num_devices = _index("num_devices", obj.get("num_devices", len(programs)))
        num_micro = _index("num_micro", obj.get("num_micro", (max(micro) + 1) if micro else 0))
        bounds.at_most("num_devices", num_devices, bounds.MAX_PIPELINE_STAGE)
        bounds.at_most("num_micro", num_micro, bounds.MAX_MICRO_BATCH)
        dp = obj.get("data_parallel", 1)
        if _index("data_parallel", dp) < 1:
            raise SpecError("data_parallel", f"must be >= 1, got {dp}")
        for k, typ, what in (("schedule", list, "a list"), ("trainable", dict, "an object"),
                             ("meta", dict, "an object")):
            if k in obj and not isinstance(obj[k], typ):
                raise SpecError(k, f"must be {what}, got {_short(obj[k])}")
        for r, t in obj.get("trainable", {}).items():
            if not isinstance(t, bool):
                raise SpecError(f"trainable.{r}", f"must be true or false, got {_short(t)}")
        return Plan(num_devices=num_devices, num_micro=num_micro, programs=programs, chunks=chunks,
                    schedule=list(obj.get("schedule", [])), trainable=dict(obj.get("trainable", {})),
                    data_parallel=dp, meta=dict(obj.get("meta", {})), tied=_tied_of(obj.get("tied", [])))

    @staticmethod
    def loads(text: str) -> "Plan":
        return Plan.from_json(json.loads(text, parse_constant=_no_constant))


PLAN_KEYS = ("num_devices", "num_micro", "data_parallel", "schedule", "trainable", "chunks", "meta", "tied",
             "programs")
TENSORS = (ACT, GRAD, WGRAD, WEIGHTS, TIED)
TIED_KEYS = ("name", "region", "chunks", "devices")


def _tied_of(obj) -> List[Tied]:
    """The ``tied`` list of a plan JSON object, every entry's keys and types checked."""
    if not isinstance(obj, list):
        raise SpecError("tied", f"must be a list, got {_short(obj)}")
    out = []
    for i, t in enumerate(obj):
        w = f"tied[{i}]"
        if not isinstance(t, dict) or set(t) != set(TIED_KEYS):
            if isinstance(t, dict) and set(t) - set(TIED_KEYS):
                raise unknown_key(w, t, TIED_KEYS)
            raise SpecError(w, f"must be an object with {', '.join(TIED_KEYS)}")
        for k in ("name", "region"):
            if not isinstance(t[k], str):
                raise SpecError(f"{w}.{k}", f"must be a string, got {_short(t[k])}")
        for k in ("chunks", "devices"):
            if not isinstance(t[k], list):
                raise SpecError(f"{w}.{k}", f"must be a list of indices, got {_short(t[k])}")
        out.append(Tied(t["name"], t["region"], tuple(_index(f"{w}.chunks[{j}]", x) for j, x in enumerate(t["chunks"])),
                        tuple(_index(f"{w}.devices[{j}]", x) for j, x in enumerate(t["devices"]))))
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _index(field: str, value) -> int:
    """A whole number >= 0 of a plan file (``0.5``, ``"0"``, ``true``: refused naming ``field``)."""
    return whole(field, value, 0, shown=_short)


def _no_constant(name: str):
    raise SpecError("plan", f"{name} is not a number JSON allows")
