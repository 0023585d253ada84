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

# Compute kinds run on the compute lane.
F = "F"      # forward of (region, chunk, micro)
B = "B"      # input-grad backward (zero-bubble split)
W = "W"      # weight-grad backward (zero-bubble split)
BW = "BW"    # fused backward: input grad and weight grad together
R = "R"      # recompute forward (central backward of a replicated region)
# Communication kinds run on the comm lane.
SEND = "SEND"
RECV = "RECV"
ALLREDUCE = "ALLREDUCE"
BROADCAST = "BROADCAST"
ALLGATHER = "ALLGATHER"   # sharded optimizer of a replicated region: update this device's share, gather all

COMPUTE_KINDS = (F, B, W, BW, R)
BACKWARD_KINDS = (B, W, BW, R)
P2P_KINDS = (SEND, RECV)
COLLECTIVE_KINDS = (ALLREDUCE, BROADCAST, ALLGATHER)
ALL_KINDS = COMPUTE_KINDS + P2P_KINDS + COLLECTIVE_KINDS

# Tensor names carried by SEND/RECV/collectives.
ACT = "act"          # output activation of (region, chunk, micro)
GRAD = "grad"        # gradient w.r.t. that output (flows to the producer's backward)
WGRAD = "wgrad"      # weight gradients of a region (all-reduce over replicas)
WEIGHTS = "weights"  # parameters of a region (broadcast from the central device, or gathered from the shards)

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
    def from_json(obj: dict) -> "Action":
        if not isinstance(obj, dict) or "kind" not in obj:
            raise ValueError(f"action must be an object with a 'kind', got {obj!r}")
        if obj["kind"] not in ALL_KINDS:
            raise ValueError(f"action kind {obj['kind']!r} unknown; allowed: {', '.join(ALL_KINDS)}")
        known = {f.name for f in fields(Action)}
        kw = {k: v for k, v in obj.items() if k in known}
        if kw.get("group") is not None and not isinstance(kw["group"], str):
            kw["group"] = tuple(int(g) for g in kw["group"])
        return Action(**kw)

    def label(self) -> str:
        """Short human name, e.g. ``F llm c1 m3`` or ``SEND act vision c0 m2 ->0``."""
        parts = [self.kind]
        if self.tensor and self.kind in P2P_KINDS:
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
    """A contiguous layer range ``[start, stop)`` of a region, and the devices holding it."""

    region: str
    index: int
    start: int
    stop: int
    devices: Tuple[int, ...]

    @property
    def layers(self) -> int:
        return self.stop - self.start


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
        seen: List[str] = []
        for c in self.chunks:
            if c.region not in seen:
                seen.append(c.region)
        return seen

    def to_json(self) -> dict:
        return {
            "num_devices": self.num_devices,
            "num_micro": self.num_micro,
            "data_parallel": self.data_parallel,
            "schedule": self.schedule,
            "trainable": self.trainable,
            "chunks": [
                {"region": c.region, "index": c.index, "start": c.start, "stop": c.stop,
                 "devices": list(c.devices)} for c in self.chunks
            ],
            "meta": self.meta,
            "programs": {str(d): [a.to_json() for a in prog] for d, prog in sorted(self.programs.items())},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @staticmethod
    def from_json(obj: dict) -> "Plan":
        if not isinstance(obj, dict) or not isinstance(obj.get("programs"), dict):
            raise ValueError("plan JSON must be an object with a 'programs' object")
        try:
            programs = {int(d): [Action.from_json(a) for a in prog] for d, prog in obj["programs"].items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"plan JSON 'programs': {e}") from None
        chunks = [Chunk(c["region"], int(c["index"]), int(c["start"]), int(c["stop"]),
                        tuple(int(x) for x in c["devices"])) for c in obj.get("chunks", [])]
        num_devices = int(obj.get("num_devices", len(programs)))
        micro = [a.micro for p in programs.values() for a in p if a.micro is not None]
        num_micro = int(obj.get("num_micro", (max(micro) + 1) if micro else 0))
        return Plan(num_devices=num_devices, num_micro=num_micro, programs=programs, chunks=chunks,
                    schedule=list(obj.get("schedule", [])), trainable=dict(obj.get("trainable", {})),
                    data_parallel=int(obj.get("data_parallel", 1)), meta=dict(obj.get("meta", {})))

    @staticmethod
    def loads(text: str) -> "Plan":
        return Plan.from_json(json.loads(text))
