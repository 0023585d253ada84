"""Cost model: execute the derived programs with the profile's durations and a link model.

Returns the makespan, bubble ratio, per-device busy time and per-device peak
memory. The numbers come from executing exactly the programs that the
runtime executes (see :mod:`execute`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from .execute import Execution, execute
from .ir import ALLGATHER, ALLREDUCE, B, BROADCAST, BW, DP_GROUP, F, R, REDUCESCATTER, SEND, TIED, W, Action, Plan
from ..errors import SpecError
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
    # peak number of forwards held for a later backward on this device: per region, and all regions together
    peak_held: Dict[str, int] = field(default_factory=dict)
    peak_held_total: int = 0


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
                             "peak_memory_mb": round(d.peak_memory_mb, 6),
                             "params_mb": round(d.params_mb, 6), "grads_mb": round(d.grads_mb, 6),
                             "optimizer_mb": round(d.optimizer_mb, 6), "peak_held": dict(d.peak_held),
                             "peak_held_total": d.peak_held_total} for d in self.devices]}


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

    def input_mb(self, region: str, chunk: int) -> float:
        """MB of a chunk's input: the previous chunk's region's ``output_mb`` (0 for the model input)."""
        if chunk > 0:
            return self.profile.region(region).output_mb
        regions = self.plan.regions()
        i = regions.index(region)
        return 0.0 if i == 0 else self.profile.region(regions[i - 1]).output_mb

    def chunk_mb(self, region: str, chunk: int, per_layer: float) -> float:
        return per_layer * self.layers[(region, chunk)]

    def held_param_mb(self, device: int, trainable_only: bool = False, regions=None) -> float:
        """MB of the parameters ``device`` holds (of its trained regions only; of ``regions`` only, if given)."""
        def counted(region):
            return (not trainable_only or self.plan.trainable.get(region, True)) and (regions is None or
                                                                                     region in regions)
        return sum(self.chunk_mb(c.region, c.index, self.profile.region(c.region).param_mb)
                   for c in self.plan.chunks if device in c.devices and counted(c.region)) + sum(
            self.tied_mb(t.name) for t in self.plan.tied_on(device) if counted(t.region))

    def dp_regions(self, a: Action, device: int):
        """The regions a data-parallel collective of ``device`` moves: its region (ZeRO-2's reduce-scatter
        after the region's last weight-gradient task), else every region not scattered earlier (None: all)."""
        if a.region is not None:
            return {a.region}
        early = {b.region for b in self.plan.programs.get(device, ()) if b.kind == REDUCESCATTER and
                 b.group == DP_GROUP and b.region is not None}
        return None if not early else {r for r in self.plan.regions() if r not in early}

    def tied_mb(self, name: str) -> float:
        """The profile's size of tied weight ``name`` (0 when the profile does not list it)."""
        return next((t.param_mb for t in self.profile.tied if t.name == name), 0.0)

    def comm(self, a: Action, device: int = 0) -> float:
        link = self.profile.link
        if a.kind == SEND:
            return link.transfer_ms(self.profile.region(a.region).output_mb)
        if a.kind not in (ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER) or link.bandwidth_gb_s <= 0:
            return 0.0
        if a.group == DP_GROUP:
            regions = self.dp_regions(a, device) if a.kind == REDUCESCATTER else None
            g, mb = self.plan.data_parallel, self.held_param_mb(device, trainable_only=True, regions=regions)
        elif a.tensor == TIED:   # the tied weights of the region held by exactly this group of devices
            g = len(a.group)
            mb = sum(self.tied_mb(t.name) for t in self.plan.tied if t.region == a.region and t.devices == a.group)
        else:
            r = self.profile.region(a.region)
            g, mb = len(a.group), r.param_mb * r.layers
        return ring_ms(a.kind, g, mb, link)


def ring_ms(kind: str, g: int, mb: float, link) -> float:
    """Ring collective over ``g`` members moving a ``mb`` MB tensor (latency + bytes / bandwidth per hop).

    all-reduce: reduce-scatter then all-gather, 2(g-1) hops of mb/g each;
    all-gather / gather / reduce-scatter: (g-1) hops of mb/g (``mb`` is the gathered or reduced total);
    broadcast: pipelined ring, (g-1) hop latencies plus one full transfer.
    """
    if g <= 1 or link.bandwidth_gb_s <= 0:
        return 0.0
    full = link.transfer_ms(mb) - link.latency_ms
    if kind == ALLREDUCE:
        return 2 * (g - 1) * link.latency_ms + 2 * (g - 1) / g * full
    if kind in (ALLGATHER, "GATHER", REDUCESCATTER):
        return (g - 1) * link.latency_ms + (g - 1) / g * full
    if kind == BROADCAST:
        return (g - 1) * link.latency_ms + full
    raise ValueError(f"no ring formula for {kind!r}")


#: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), flash attention
#: (no s x s scores kept): a layer keeps 34 x s x h half-precision bytes; under T-way tensor parallelism
#: without sequence parallelism 24 of them split T ways and 10 (the LayerNorm inputs, the residual, the
#: dropout masks) stay whole on every rank
TP_SPLIT_SHARE = 24.0 / 34.0


def tensor_parallel_regions(plan: Plan) -> Tuple[str, ...]:
    """The regions whose layers the plan's T ranks split: ``meta["tensor_parallel_regions"]``, else the
    language model (the last region: the runtime splits it; encoders stay whole in the T group)."""
    if plan.tensor_parallel <= 1:
        return ()
    return tuple(plan.meta.get("tensor_parallel_regions") or plan.regions()[-1:])


def tensor_parallel_profile(profile: ModelProfile, T: int, split) -> ModelProfile:
    """The per-rank profile of a whole-layer profile under T-way tensor parallelism of the ``split`` regions.

    A profile's costs are a whole layer's (``hyperparallel profile`` measures without T; the estimate and a
    hand-written profile state whole layers). Per rank of a split region: parameters (hence grads and
    optimizer state) ``whole_param_mb`` (the norms, which every rank holds whole) plus 1/T of the rest
    (:func:`tensor_parallel_share`; a measured profile gives the norms' share, the estimate counts no norms);
    compute times (layers and head: the LM head is vocabulary-parallel) 1/T, an ideal
    split; activations ``1 - TP_SPLIT_SHARE + TP_SPLIT_SHARE / T`` of a layer's (:data:`TP_SPLIT_SHARE`);
    and per layer two all-reduces forward (after ``o_proj`` and ``down_proj``; a recompute repeats them) and
    two backward (before q/k/v and gate/up), each of the layer's output (``output_mb``: tokens x hidden x
    the compute dtype) over the T group on ``tensor_link`` (else ``link``) by :func:`ring_ms`, charged in the
    task's time (they block the layer). The stage output stays whole on every rank (``output_mb``).
    A profile whose activations count attention scores (the estimate's ``5 x heads x context / hidden``
    term, no flash attention) splits those T ways too: the 10/34 whole share overstates it there (the
    predicted peak errs high)."""
    if T <= 1:
        return profile
    link = profile.tensor_link or profile.link
    keep = 1.0 - TP_SPLIT_SHARE + TP_SPLIT_SHARE / T
    regions = []
    for r in profile.regions:
        if r.name in split:
            ar = 2 * ring_ms(ALLREDUCE, T, r.output_mb, link)
            whole = min(r.whole_param_mb, r.param_mb)
            r = replace(r, forward_ms=r.forward_ms / T + ar, backward_ms=r.backward_ms / T + ar,
                        weight_ms=r.weight_ms / T, head_forward_ms=r.head_forward_ms / T,
                        head_backward_ms=r.head_backward_ms / T, head_weight_ms=r.head_weight_ms / T,
                        param_mb=tensor_parallel_share(r.param_mb, ((r.param_mb - whole, T),)), whole_param_mb=whole,
                        activation_mb=r.activation_mb * keep)
        regions.append(r)
    return replace(profile, regions=tuple(regions))


def tensor_parallel_share(size: float, split=()) -> float:
    """One rank's part of ``size`` of which ``split`` (``((part, slices), ...)``) is split into ``slices``
    equal slices each (T, or the key/value heads' count when T exceeds it: each slice held by T / kv
    ranks), the rest held whole: ``size - sum(part) + sum(part / slices)``. A ``(part, slices, rows)``
    entry is ``rows`` long along its split axis, which ``slices`` does not divide (a vocabulary padded to
    a multiple of T): each slice holds ceil(rows / slices) of them, zero padding included."""
    def one(e):
        return e[0] / e[1] if len(e) < 3 else e[0] / e[2] * -(-e[2] // e[1])
    return size - sum(e[0] for e in split) + sum(one(e) for e in split)


def sharded_regions(plan: Plan) -> set:
    """Regions whose optimizer state is sharded over their pipeline replicas (an ALLGATHER of their weights)."""
    return {a.region for p in plan.programs.values() for a in p if a.kind == ALLGATHER and a.group != DP_GROUP}


def zero_level(plan: Plan) -> int:
    """The plan's ZeRO level over the data-parallel group: 2 (a REDUCESCATTER of the gradients), 1 (an
    ALLGATHER of the weights over the group after an all-reduce), 0 (neither)."""
    kinds = {a.kind for p in plan.programs.values() for a in p if a.group == DP_GROUP}
    return 2 if REDUCESCATTER in kinds else (1 if ALLGATHER in kinds else 0)


def shard_elements(n: int, replicas: int) -> int:
    """Elements of one replica's share of a flat group of ``n`` elements: ``ceil(n / replicas)`` (the group is
    padded to ``replicas x`` that; the runtime's flat shares, :mod:`hyperparallel.runtime.sharded`)."""
    return -(-int(n) // int(replicas))


def share_bytes(size: int, replicas: int, itemsize: int = 4) -> int:
    """Bytes of one replica's share of a flat group of ``size`` bytes of ``itemsize``-byte elements, padding
    included, as the runtime allocates it (:func:`shard_elements`; float32 master weights: 4)."""
    return shard_elements(int(size) // itemsize, replicas) * itemsize


def _device_state(plan: Plan, d: int, size, shard, groups):
    """Device ``d``'s (parameters, {region: its trained chunks' size}, {region: its share's size},
    {region: replicas it is sharded over (1: whole)}) for :func:`static_memory` / :func:`grad_peak`."""
    sharded = sharded_regions(plan)
    zero, D = zero_level(plan), plan.data_parallel
    central = {s["region"]: s.get("backward") == "central" for s in plan.schedule if s.get("skeleton") == "transpose"}
    split = groups or (lambda r, c: {None: size(r, c)})
    params = 0.0
    whole: Dict[str, float] = {}                                 # region -> its trained chunks' size
    flat: Dict[Tuple[str, object], float] = {}                   # (region, group) -> size
    replicas: Dict[str, int] = {}
    for c in plan.chunks_on(d):
        p = size(c.region, c.index)
        holds_state = plan.trainable.get(c.region, True) and not (central.get(c.region) and d != min(c.devices))
        params += p
        if not holds_state:
            continue
        whole[c.region] = whole.get(c.region, 0.0) + p
        replicas[c.region] = len(c.devices) if c.region in sharded else D if zero else 1
        for g, gp in split(c.region, c.index).items():
            flat[(c.region, g)] = flat.get((c.region, g), 0.0) + gp
    shares = {r: 0.0 for r in whole}
    for (r, _), gp in flat.items():
        shares[r] += shard(gp, replicas[r]) if replicas[r] > 1 else gp
    return params, whole, shares, replicas


def static_memory(plan: Plan, size: Callable[[str, int], float], optimizer_factor: float,
                  shard: Callable[[float, int], float] = lambda p, n: p / n,
                  groups: Callable[[str, int], Dict[object, float]] = None,
                  split: Optional[Callable[[str, int], tuple]] = None) -> Dict[int, Tuple[float, float, float]]:
    """Per device: (parameters, grads, optimizer state) of the chunks it holds, in the unit of ``size``.

    ``size(region, chunk)``: the parameter size of a chunk (the cost model's MB from the profile; a
    test's measured bytes). Every chunk a device holds counts its parameters (encoder replicas
    included); grads (1x) and optimizer state (``optimizer_factor`` x) count for trainable chunks whose
    optimizer runs there (not the parameter-only replicas of a central backward). A region whose
    optimizer state is sharded (``transpose(optimizer=sharded)``) counts ``shard(size, replicas)`` of
    it per replica; with ZeRO over the D data-parallel replicas (:func:`zero_level`) every trained
    region's optimizer state counts ``shard(size, D)`` per rank, and at level 2 its grads too (what a rank
    holds once the step's gradients are reduced).

    A share is what the runtime lays out: per device, one flat vector per trained region and weight-decay
    group, of the sizes of that group in every chunk of the region the device holds. ``groups(region,
    chunk)``: ``{group: size}`` of a chunk's parameters by weight-decay group (default: one group, the whole
    ``size``); ``shard`` is applied to each (region, group) sum: 1/n by default (the profile's MB), the
    runtime's padded share (:func:`share_bytes`) for exact bytes.

    ``split(region, chunk)``: with T > 1, the parts of ``size(region, chunk)`` (a whole chunk's) that the T
    ranks split, as :func:`tensor_parallel_share` reads them (a padded vocabulary's with its rows); each rank
    then holds its share of the chunks of :func:`tensor_parallel_regions` (a test's real bytes: the split
    weights' whole bytes, the norms' whole), one weight-decay group per split chunk. Without it ``size`` is
    already one rank's (the cost model's split profile).
    """
    if split is not None and plan.tensor_parallel > 1:
        tp, whole_size, by_group = tensor_parallel_regions(plan), size, groups
        size = lambda r, c: tensor_parallel_share(whole_size(r, c), split(r, c)) if r in tp else whole_size(r, c)  # noqa: E731
        if by_group is not None:
            groups = lambda r, c: {None: size(r, c)} if r in tp else by_group(r, c)  # noqa: E731
    zero, sharded = zero_level(plan), sharded_regions(plan)
    out = {}
    for d in range(plan.num_devices):
        params, whole, shares, replicas = _device_state(plan, d, size, shard, groups)
        grads = sum(shares[r] if zero == 2 and r not in sharded else whole[r] for r in whole)
        optim = sum(shares[r] if replicas[r] > 1 else whole[r] for r in whole) * optimizer_factor
        out[d] = (params, grads, optim)
    return out


def grad_peak(plan: Plan, size: Callable[[str, int], float], shard: Callable[[float, int], float] = lambda p, n: p / n,
              groups: Callable[[str, int], Dict[object, float]] = None) -> Dict[int, float]:
    """Per device: the peak size of the gradients it holds during the step, in the unit of ``size`` (see
    :func:`static_memory` for ``size``, ``shard``, ``groups``). Walking the device's program: a chunk's
    gradients are held from its first weight-gradient task (W or BW) on; a ZeRO-2 ``REDUCESCATTER`` replaces
    its region's (or, without a region, every region's not yet scattered) by the region's share. Without
    ZeRO-2 the peak is the static grads (every gradient held to the step's end)."""
    out = {}
    for d in range(plan.num_devices):
        _, whole, shares, _ = _device_state(plan, d, size, shard, groups)
        chunks = {(c.region, c.index) for c in plan.chunks_on(d) if c.region in whole}
        started, scattered = set(), set()
        held = peak = 0.0
        for a in plan.programs.get(d, ()):
            if a.kind in (W, BW) and not a.step and (a.region, a.chunk) in chunks and (a.region, a.chunk) not in started:
                started.add((a.region, a.chunk))
                held += size(a.region, a.chunk)
            elif a.kind == REDUCESCATTER and a.group == DP_GROUP:
                for r in ([a.region] if a.region is not None else sorted(whole)):
                    if r in whole and r not in scattered:
                        scattered.add(r)
                        held += shares[r] - sum(size(r, c) for rr, c in started if rr == r)
            peak = max(peak, held)
        out[d] = peak
    return out


def tied_memory(plan: Plan, size: Callable[[str], float], optimizer_factor: float) -> Dict[int, Tuple[float, ...]]:
    """Per device: (parameters, grads, optimizer state) of the tied weights it holds a copy of (``size(name)``):
    every holder keeps a whole copy, its gradient and its optimizer state (the copies stay equal); a device
    holding two copies holds one parameter. With ZeRO (:func:`zero_level`) its optimizer state, and at level
    2 its gradient, count 1/D per rank, as the chunks' do."""
    out = {d: (0.0, 0.0, 0.0) for d in range(plan.num_devices)}
    zero, D = zero_level(plan), plan.data_parallel
    for t in plan.tied:
        mb = size(t.name)
        state = mb if plan.trainable.get(t.region, True) else 0.0
        for d in t.devices:
            p, g, o = out[d]
            out[d] = (p + mb, g + (state / D if zero == 2 else state), o + (state / D if zero else state) * optimizer_factor)
    return out


Key = Tuple[int, str, int, int]   # (step, region, chunk, micro-batch)


def activation_events(plan: Plan, ex: Execution, d: int, held: Callable[[Key], float], kept: Callable[[Key], float],
                      working: Callable[[Key], float]) -> List[tuple]:
    """Device ``d``'s activation events ``(time, 1 alloc / 0 release, size, region of a held forward or None)``,
    sizes in any unit: ``held(key)`` of a forward (or recompute) held from its start to the end of its last
    backward task there; ``kept(key)``, the input a recomputed chunk's forward keeps until its R;
    ``working(key)``, what a forward without backward there uses while it runs (see :func:`_memory`)."""
    events = []
    last_bwd = {}
    recompute_at = {}
    recomputed = {(c.region, c.index) for c in plan.chunks if c.recompute}
    for t in ex.timeline[d]:
        a = t.action
        if a.kind in (B, W, BW):
            key = (t.step, a.region, a.chunk, a.micro)
            last_bwd[key] = max(last_bwd.get(key, 0.0), t.end)
        elif a.kind == R:
            recompute_at[(t.step + a.step, a.region, a.chunk, a.micro)] = t.start
    for t in ex.timeline[d]:
        a = t.action
        if a.kind not in (F, R):
            continue
        key = (t.step + a.step, a.region, a.chunk, a.micro)
        if a.kind == F and key in recompute_at and (a.region, a.chunk) in recomputed:
            events.append((t.start, 1, kept(key), None))   # the input, kept until the R
            events.append((recompute_at[key], 0, -kept(key), None))
        # a forward whose task is recomputed here keeps nothing: the recompute is held instead
        end = None if a.kind == F and key in recompute_at else last_bwd.get(key)
        if end is None and a.kind == F:
            # no backward here (frozen, nothing trainable before it): nothing is stashed; the
            # forward only needs its working set while it runs
            size = working(key)
            events.append((t.start, 1, size, None))
            events.append((t.end, 0, -size, None))
            continue
        size = held(key)
        # at equal times a release sorts before an allocation (a backward ends, the next forward starts)
        events.append((t.start, 1, size, a.region if end is not None else None))
        events.append((end if end is not None else t.end, 0, -size, a.region if end is not None else None))
    return events


def peak_of(events: List[tuple]) -> float:
    """The peak live size of :func:`activation_events` (releases first at equal times)."""
    live = peak = 0.0
    for _, _, size, _ in sorted(events, key=lambda e: (e[0], e[1])):
        live += size
        peak = max(peak, live)
    return peak


def _memory(plan: Plan, profile: ModelProfile, dur: Durations, ex: Execution) -> Dict[int, tuple]:
    """Per device: (peak stashed activations, peak total, static, parameters, grads, optimizer state) in MB,
    then the peak count of held forwards per region and in all.

    The activations of (region, chunk, micro-batch) live from the start of its forward (or
    recompute) to the end of its last backward task on that device (B, W or BW); a forward
    with no backward there, or whose task is recomputed there (central backward on the central
    device), holds one layer's activations while it runs, and is not a held forward. The forward
    of a recomputed chunk (``Chunk.recompute``) also keeps its input (:func:`input_mb`) from its
    start to the start of its R. Static memory: :func:`static_memory`.
    """
    static_parts = static_memory(plan, lambda r, c: dur.chunk_mb(r, c, profile.region(r).param_mb),
                                 profile.optimizer_factor)
    for d, extra in tied_memory(plan, dur.tied_mb, profile.optimizer_factor).items():
        static_parts[d] = tuple(a + b for a, b in zip(static_parts[d], extra))
    out = {}
    for d in range(plan.num_devices):
        events = activation_events(
            plan, ex, d, held=lambda k: dur.chunk_mb(k[1], k[2], profile.region(k[1]).activation_mb),
            kept=lambda k: dur.input_mb(k[1], k[2]), working=lambda k: profile.region(k[1]).activation_mb)
        live = peak = 0.0
        count: Dict[str, int] = {}
        held_peak: Dict[str, int] = {r: 0 for r in plan.regions()}
        total = total_peak = 0
        for _, start, mb, region in sorted(events, key=lambda e: (e[0], e[1])):
            live += mb
            peak = max(peak, live)
            if region is not None:
                step = 1 if start else -1
                count[region] = count.get(region, 0) + step
                total += step
                held_peak[region] = max(held_peak[region], count[region])
                total_peak = max(total_peak, total)
        params, grads, optim = static_parts[d]
        static = params + grads + optim
        out[d] = (peak, peak + static, static, params, grads, optim, held_peak, total_peak)
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


def simulate(plan: Plan, profile: ModelProfile, steps: int = 1,
             work: Optional[Callable[[Action], float]] = None) -> CostReport:
    """Execute ``steps`` optimizer steps; per-step figures come from the last step (steady state); with
    T > 1 (``plan.tensor_parallel``) on one rank of each T group (:func:`tensor_parallel_profile`).
    ``work(action)``: a multiplier on the action's compute time (the runtime overhead per action
    excluded), e.g. a micro-batch's encoder work over the profile's average (``simulate --data-steps``)."""
    if profile.device_scale and len(profile.device_scale) != plan.num_devices:
        raise SpecError("mpipe.profile.device_scale", f"has {len(profile.device_scale)} entries but the plan has "
                        f"{plan.num_devices} pipeline devices (one per device, or leave it out)")
    profile = tensor_parallel_profile(profile, plan.tensor_parallel, tensor_parallel_regions(plan))
    dur = Durations(plan, profile)
    run, device_of = _per_device_collectives(plan)
    over = profile.action_overhead_ms

    def compute(a: Action) -> float:
        return dur.compute(a) if work is None else (dur.compute(a) - over) * work(a) + over
    ex = execute(run, compute, lambda a: dur.comm(a, device_of.get(id(a), 0)), steps=steps,
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
