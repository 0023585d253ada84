"""Cost model: execute the derived programs with the profile's durations and a link model.

Returns the makespan, bubble ratio, per-device busy time and per-device peak
memory. The numbers come from executing exactly the programs that the
runtime executes (see :mod:`execute`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List

from .execute import Execution, execute
from .ir import ALLREDUCE, B, BROADCAST, BW, DP_GROUP, F, R, SEND, W, Action, Plan
from .errors import SpecError
from .profile import ModelProfile, task_ms


@dataclass
class DeviceCost:
    device: int
    busy_ms: float
    peak_activation_mb: float
    peak_memory_mb: float
    static_memory_mb: float
    params_mb: float = 0.0      # the parts of static_memory_mb
    grads_mb: float = 0.0
    optimizer_mb: float = 0.0


@dataclass
class CostReport:
    makespan_ms: float
    step_ms: float
    bubble_ratio: float
    devices: List[DeviceCost]
    execution: Execution = field(repr=False, default=None)

    def to_json(self) -> dict:
        return {"makespan_ms": round(self.makespan_ms, 6), "step_ms": round(self.step_ms, 6),
                "bubble_ratio": round(self.bubble_ratio, 6),
                "devices": [{"device": d.device, "busy_ms": round(d.busy_ms, 6),
                             "peak_activation_mb": round(d.peak_activation_mb, 6),
                             "peak_memory_mb": round(d.peak_memory_mb, 6)} for d in self.devices]}


class Durations:
    """Per-action durations in ms from a model profile (per-layer costs summed per chunk)."""

    def __init__(self, plan: Plan, profile: ModelProfile):
        self.plan, self.profile = plan, profile
        self.layers = {(c.region, c.index): c.layers for c in plan.chunks}
        last = {}
        for c in plan.chunks:
            last[c.region] = max(last.get(c.region, 0), c.stop)
        self.head = {(c.region, c.index): c.stop == last[c.region] for c in plan.chunks}
        self._cache: Dict[tuple, float] = {}

    def compute(self, a: Action) -> float:
        key = (a.kind, a.region, a.chunk)
        ms = self._cache.get(key)
        if ms is None:
            ms = self._cache[key] = task_ms(self.profile.region(a.region), a.kind, self.layers[(a.region, a.chunk)],
                                            self.head[(a.region, a.chunk)]) + self.profile.action_overhead_ms
        return ms

    def chunk_mb(self, region: str, chunk: int, per_layer: float) -> float:
        return per_layer * self.layers[(region, chunk)]

    def held_param_mb(self, device: int, trainable_only: bool = False) -> float:
        return sum(self.chunk_mb(c.region, c.index, self.profile.region(c.region).param_mb)
                   for c in self.plan.chunks if device in c.devices
                   and (not trainable_only or self.plan.trainable.get(c.region, True)))

    def comm(self, a: Action, device: int = 0) -> float:
        link = self.profile.link
        if a.kind == SEND:
            return link.transfer_ms(self.profile.region(a.region).output_mb)
        if a.kind not in (ALLREDUCE, BROADCAST) or link.bandwidth_gb_s <= 0:
            return 0.0
        if a.group == DP_GROUP:
            g, mb = self.plan.data_parallel, self.held_param_mb(device, trainable_only=True)
        else:
            r = self.profile.region(a.region)
            g, mb = len(a.group), r.param_mb * r.layers
        return ring_ms(a.kind, g, mb, link)


def ring_ms(kind: str, g: int, mb: float, link) -> float:
    """Ring collective over ``g`` members moving a ``mb`` MB tensor (latency + bytes / bandwidth per hop).

    all-reduce: reduce-scatter then all-gather, 2(g-1) hops of mb/g each;
    all-gather / gather: (g-1) hops of mb/g (``mb`` is the gathered total);
    broadcast: pipelined ring, (g-1) hop latencies plus one full transfer.
    """
    if g <= 1 or link.bandwidth_gb_s <= 0:
        return 0.0
    full = link.transfer_ms(mb) - link.latency_ms
    if kind == ALLREDUCE:
        return 2 * (g - 1) * link.latency_ms + 2 * (g - 1) / g * full
    if kind in ("ALLGATHER", "GATHER"):
        return (g - 1) * link.latency_ms + (g - 1) / g * full
    if kind == BROADCAST:
        return (g - 1) * link.latency_ms + full
    raise ValueError(f"no ring formula for {kind!r}")


def _memory(plan: Plan, profile: ModelProfile, dur: Durations, ex: Execution) -> Dict[int, tuple]:
    """Per device: (peak stashed activations, peak total, static, parameters, grads, optimizer state) in MB.

    The activations of (region, chunk, micro-batch) live from the start of its forward (or
    recompute) to the end of its last backward task on that device (B, W or BW); a forward
    with no backward holds one layer's activations while it runs. Static memory: parameters of
    every chunk the device holds (encoder replicas included), plus grads (1x) and optimizer state
    (``optimizer_factor`` x) for trainable chunks whose optimizer runs there (not the
    parameter-only replicas of a central backward).
    """
    central = {s["region"]: s.get("backward") == "central" for s in plan.schedule if s.get("skeleton") == "transpose"}
    out = {}
    for d in range(plan.num_devices):
        events = []
        last_bwd = {}
        for t in ex.timeline[d]:
            a = t.action
            if a.kind in (B, W, BW):
                key = (t.step, a.region, a.chunk, a.micro)
                last_bwd[key] = max(last_bwd.get(key, 0.0), t.end)
        for t in ex.timeline[d]:
            a = t.action
            if a.kind in (F, R):
                key = (t.step + a.step, a.region, a.chunk, a.micro)
                mb = dur.chunk_mb(a.region, a.chunk, profile.region(a.region).activation_mb)
                end = last_bwd.get(key)
                if end is None and a.kind == F:
                    # no backward here (frozen, nothing trainable before it): nothing is stashed; the
                    # forward only needs one layer's working set while it runs
                    end, mb = t.end, profile.region(a.region).activation_mb
                events.append((t.start, 1, mb))
                events.append((end if end is not None else t.end, 0, -mb))
        live = peak = 0.0
        for _, _, mb in sorted(events):
            live += mb
            peak = max(peak, live)
        params = grads = 0.0
        for c in plan.chunks:
            if d not in c.devices:
                continue
            r = profile.region(c.region)
            p = dur.chunk_mb(c.region, c.index, r.param_mb)
            holds_state = plan.trainable.get(c.region, r.trainable) and not (
                central.get(c.region) and d != min(c.devices))
            params += p
            grads += p if holds_state else 0.0
        optim = grads * profile.optimizer_factor
        static = params + grads + optim
        out[d] = (peak, peak + static, static, params, grads, optim)
    return out


def _per_device_collectives(plan: Plan):
    """(plan with a distinct action object for every data-parallel collective, {id(action): device}).

    The executor runs a data-parallel all-reduce once per device and asks its duration by action;
    each device's is costed with that device's own parameter bytes.
    """
    programs, device_of = {}, {}
    for d, prog in plan.programs.items():
        out = []
        for a in prog:
            if a.group == DP_GROUP:
                a = replace(a)
                device_of[id(a)] = d
            out.append(a)
        programs[d] = out
    return replace(plan, programs=programs), device_of


def simulate(plan: Plan, profile: ModelProfile, steps: int = 1) -> CostReport:
    """Execute ``steps`` optimizer steps; per-step figures come from the last step (steady state)."""
    if profile.device_scale and len(profile.device_scale) != plan.num_devices:
        raise SpecError("mpipe.profile.device_scale", f"has {len(profile.device_scale)} entries but the plan has "
                        f"{plan.num_devices} pipeline devices (one per device, or leave it out)")
    dur = Durations(plan, profile)
    run, device_of = _per_device_collectives(plan)
    ex = execute(run, dur.compute, lambda a: dur.comm(a, device_of.get(id(a), 0)), steps=steps,
                 device_scale=profile.device_scale)
    # the optimizer update and the loss all-reduce follow every step's programs
    step_ms = ex.step_ends[-1] - (ex.step_ends[-2] if steps > 1 else 0.0) + profile.step_overhead_ms
    mem = _memory(plan, profile, dur, ex)
    devices = []
    for d in range(plan.num_devices):
        busy = sum(t.end - t.start for t in ex.timeline[d] if t.lane == "compute" and t.step == steps - 1)
        devices.append(DeviceCost(d, busy, *mem[d]))
    span = step_ms if step_ms > 0 else 1.0
    bubble = 1.0 - sum(x.busy_ms for x in devices) / (plan.num_devices * span)
    return CostReport(makespan_ms=step_ms, step_ms=step_ms, bubble_ratio=bubble, devices=devices, execution=ex)
