"""Model profile: the ordered regions of a model with per-layer costs.

Costs are per layer and per micro-batch: forward time, input-grad time (B),
weight-grad time (W), activation memory kept for backward, bytes of the output
passed to the next layer, and parameter memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from . import bounds
from ..errors import SpecError, is_whole, number, unknown_key, whole

COST_KEYS = ("forward_ms", "backward_ms", "weight_ms", "activation_mb", "output_mb", "param_mb",
             "head_forward_ms", "head_backward_ms", "head_weight_ms", "whole_param_mb")
REGION_KEYS = ("name", "layers", "trainable", "fixed_share", "spread") + COST_KEYS
TIME_KEYS = ("forward_ms", "backward_ms", "weight_ms", "head_forward_ms", "head_backward_ms", "head_weight_ms")
SUMMARY_SHARE = 0.1   # a per-layer cost under this share of its region's per-layer time leaves the summary spread


@dataclass(frozen=True)
class RegionProfile:
    name: str
    layers: int
    trainable: bool = True
    forward_ms: float = 1.0
    backward_ms: float = 1.0
    weight_ms: float = 0.0
    activation_mb: float = 0.0
    output_mb: float = 0.0
    param_mb: float = 0.0
    # extra time of the region's head, run by the chunk that holds its last layer (an LLM's output
    # head and loss, an encoder's projector): per micro-batch, not per layer
    head_forward_ms: float = 0.0
    head_backward_ms: float = 0.0
    head_weight_ms: float = 0.0
    # the part of param_mb that each rank of a tensor-parallel group (parallel_config.model_parallel) keeps
    # whole (the norms; the rest splits T ways): ``hyperparallel profile`` measures it from the model
    # adapter's split weights; 0 (everything splits) in a hand-written profile and the estimate
    whole_param_mb: float = 0.0
    # the share of a task's time that does not grow with the micro-batch's encoder work (per-micro-batch
    # dispatch and fixed-size work; ``tools/encoder_scaling.py`` measures it): a replay of the data's
    # per-step work (``simulate --data-steps``) scales only the rest. 0: time proportional to the work
    fixed_share: float = 0.0
    # how much each time cost moved over the profile's repeated measurements: ((cost, (max - min) /
    # median), ...); () when not measured (a hand-written profile, or a single repeat)
    spread: Tuple[Tuple[str, float], ...] = ()


def task_ms(region: RegionProfile, kind: str, layers: int, head: bool = False) -> float:
    """Duration of one compute task of ``kind`` (F, R, B, W, BW) over ``layers`` layers of ``region``;
    ``head``: the task's chunk holds the region's last layer, so it also runs the region's head."""
    per = {"F": region.forward_ms, "R": region.forward_ms, "B": region.backward_ms, "W": region.weight_ms,
           "BW": region.backward_ms + region.weight_ms}[kind]
    if not head:
        return per * layers
    extra = {"F": region.head_forward_ms, "R": region.head_forward_ms, "B": region.head_backward_ms,
             "W": region.head_weight_ms, "BW": region.head_backward_ms + region.head_weight_ms}[kind]
    return per * layers + extra


@dataclass(frozen=True)
class LinkProfile:
    """Point-to-point link: latency plus bytes / bandwidth. bandwidth 0 = free communication."""

    latency_ms: float = 0.0
    bandwidth_gb_s: float = 0.0

    def transfer_ms(self, mb: float) -> float:
        if self.bandwidth_gb_s <= 0:
            return 0.0
        return self.latency_ms + mb / 1024.0 / self.bandwidth_gb_s * 1000.0


@dataclass(frozen=True)
class TiedWeight:
    """One weight that several layers of a region share (an LLM's input embedding and LM head when the
    config ties them): one logical parameter. ``layers``: a layer of each holder (the chunk that holds
    that layer holds a copy: layer 0 for the embedding, the region's last layer for the head);
    ``param_mb``: its size (every device holding a copy holds it, its grads and optimizer state)."""

    name: str
    region: str
    layers: Tuple[int, ...]
    param_mb: float = 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "region": self.region, "layers": list(self.layers), "param_mb": self.param_mb}


TIED_KEYS = ("name", "region", "layers", "param_mb")


@dataclass(frozen=True)
class ModelProfile:
    regions: Tuple[RegionProfile, ...]
    link: LinkProfile = LinkProfile()
    optimizer_factor: float = 2.0  # optimizer state bytes per parameter byte (Adam: m and v)
    # where the costs were measured (``hyperparallel profile`` writes it): cpu, cores, device,
    # mindspore; None for a hand-written or paper profile
    measured_on: Optional[Tuple[Tuple[str, object], ...]] = None
    # per pipeline device, a multiplier on every compute duration there (1 = the region costs):
    # devices of unequal speed, e.g. the cores of a VM; () = all equal
    device_scale: Tuple[float, ...] = ()
    # the runtime's own time, measured in a pipeline run: host work per compute action (interpreter,
    # graph cuts, reading the loss) and per step (optimizer update, loss all-reduce)
    action_overhead_ms: float = 0.0
    step_overhead_ms: float = 0.0
    # the micro-batch size (samples) the per-micro-batch costs were measured at; None: not recorded
    micro_batch_size: Optional[int] = None
    # weights shared by layers of a region (tied word embeddings): their copies' gradients are summed
    # over the devices holding them before the optimizer (:mod:`.derive` emits the all-reduce)
    tied: Tuple[TiedWeight, ...] = ()
    # the number of repeated measurements the regions' ``spread`` is over; None: not recorded
    repeats: Optional[int] = None
    # the link inside a stage's tensor-parallel group (one node), for its all-reduces; None: ``link``
    tensor_link: Optional[LinkProfile] = None

    def __post_init__(self):
        object.__setattr__(self, "_by_name", {r.name: r for r in self.regions})

    def region(self, name: str) -> RegionProfile:
        r = self._by_name.get(name) if isinstance(name, str) else None
        if r is not None:
            return r
        raise SpecError("region", f"unknown region {name!r}; allowed: {', '.join(self.names())}")

    def names(self) -> Tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    def index(self, name: str) -> int:
        if not hasattr(self, "_index"):
            object.__setattr__(self, "_index", {r.name: i for i, r in enumerate(self.regions)})
        return self._index[self.region(name).name]


def _at_most(where: str, value, maximum: float) -> float:
    """A number >= 0 of the profile (:func:`~hyperparallel.errors.number`) that is at most ``maximum``."""
    return bounds.at_most(where, number(where, value), maximum)


def _count(where: str, value, maximum: Optional[int] = None) -> int:
    """A whole number >= 1 of the profile (:func:`~hyperparallel.errors.whole`), at most ``maximum``."""
    whole(where, value)
    return value if maximum is None else bounds.at_most(where, value, maximum)


def parse_profile(obj, where: str = "mpipe.profile") -> ModelProfile:
    """Build a ModelProfile from the recipe's ``mpipe.profile`` mapping, refusing bad input."""
    if not isinstance(obj, dict):
        raise SpecError(where, "must be a mapping with 'regions' (and optional 'link')")
    top = ("regions", "link", "optimizer_factor", "measured_on", "device_scale", "action_overhead_ms",
           "step_overhead_ms", "micro_batch_size", "tied", "repeats", "tensor_link")
    unknown = set(obj) - set(top)
    if unknown:
        raise unknown_key(where, obj, top)
    regions_obj = obj.get("regions")
    if not isinstance(regions_obj, list) or not regions_obj:
        raise SpecError(f"{where}.regions", "missing or empty; give a list of regions in data-flow order")
    bounds.at_most(f"{where}.regions", len(regions_obj), bounds.MAX_REGIONS, "regions")
    regions, seen = [], set()
    for i, r in enumerate(regions_obj):
        w = f"{where}.regions[{i}]"
        if not isinstance(r, dict):
            raise SpecError(w, "must be a mapping with keys " + ", ".join(REGION_KEYS))
        unknown = set(r) - set(REGION_KEYS)
        if unknown:
            raise unknown_key(w, r, REGION_KEYS)
        for k in ("name", "layers"):
            if k not in r:
                raise SpecError(f"{w}.{k}", "missing")
        name = r["name"]
        if not isinstance(name, str) or not name:
            raise SpecError(f"{w}.name", f"must be a non-empty string, got {name!r}")
        if name in seen:
            raise SpecError(f"{w}.name", f"duplicate region name {name!r}")
        trainable = r.get("trainable", True)
        if not isinstance(trainable, bool):
            raise SpecError(f"{w}.trainable", f"must be true or false, got {trainable!r}")
        kw = {k: _at_most(f"{w}.{k}", r[k], bounds.MAX_COST) for k in COST_KEYS if k in r}
        if kw.get("whole_param_mb", 0.0) > kw.get("param_mb", 0.0):
            raise SpecError(f"{w}.whole_param_mb", f"{kw['whole_param_mb']} exceeds param_mb "
                                                   f"({kw.get('param_mb', 0.0)}): it is the part of it kept whole")
        if "fixed_share" in r:
            kw["fixed_share"] = _at_most(f"{w}.fixed_share", r["fixed_share"], 1.0)
        if "spread" in r:
            kw["spread"] = parse_spread(r["spread"], f"{w}.spread")
        seen.add(name)
        regions.append(RegionProfile(name=name, layers=_count(f"{w}.layers", r["layers"], bounds.MAX_LAYERS),
                                     trainable=trainable, **kw))
    link = _link(obj.get("link", {}) or {}, f"{where}.link")
    tensor_link = None if obj.get("tensor_link") is None else _link(obj["tensor_link"], f"{where}.tensor_link")
    opt = number(f"{where}.optimizer_factor", obj.get("optimizer_factor", 2.0))
    scale = obj.get("device_scale", []) or []
    if not isinstance(scale, list):
        raise SpecError(f"{where}.device_scale", f"must be a list of numbers > 0 (one per pipeline device), got {scale!r}")
    for i, v in enumerate(scale):
        number(f"{where}.device_scale[{i}]", v, 0.0, strict=True)
    return ModelProfile(regions=tuple(regions), link=link, tensor_link=tensor_link, optimizer_factor=opt,
                        measured_on=_measured_on(obj.get("measured_on"), f"{where}.measured_on"),
                        device_scale=tuple(float(v) for v in scale),
                        action_overhead_ms=number(f"{where}.action_overhead_ms", obj.get("action_overhead_ms", 0.0)),
                        step_overhead_ms=number(f"{where}.step_overhead_ms", obj.get("step_overhead_ms", 0.0)),
                        micro_batch_size=(None if obj.get("micro_batch_size") is None else
                                          _count(f"{where}.micro_batch_size", obj["micro_batch_size"])),
                        tied=parse_tied(obj.get("tied", []), {r.name: r.layers for r in regions}, f"{where}.tied"),
                        repeats=(None if obj.get("repeats") is None else
                                 _count(f"{where}.repeats", obj["repeats"])))


def _link(link_obj, where: str) -> LinkProfile:
    """A ``{latency_ms, bandwidth_gb_s}`` mapping as a LinkProfile, refusing bad input."""
    if not isinstance(link_obj, dict):
        raise SpecError(where, "must be a mapping with latency_ms, bandwidth_gb_s")
    unknown = set(link_obj) - {"latency_ms", "bandwidth_gb_s"}
    if unknown:
        raise unknown_key(where, link_obj, ("latency_ms", "bandwidth_gb_s"))
    return LinkProfile(**{k: number(f"{where}.{k}", v) for k, v in link_obj.items()})


def parse_spread(obj, where: str) -> Tuple[Tuple[str, float], ...]:
    """``spread: {forward_ms: 0.2, ...}``: per time cost, its relative spread (>= 0) over the repeats."""
    if not isinstance(obj, dict):
        raise SpecError(where, f"must be a mapping of {', '.join(TIME_KEYS)} to relative spreads, got {obj!r}")
    if set(obj) - set(TIME_KEYS):
        raise unknown_key(where, obj, TIME_KEYS)
    return tuple((k, _at_most(f"{where}.{k}", obj[k], bounds.MAX_COST)) for k in TIME_KEYS if k in obj)


def profile_spread(profile: ModelProfile) -> Optional[Tuple[float, str]]:
    """(the largest relative spread of a per-layer time cost, ``region.cost``) of a measured profile; costs
    under :data:`SUMMARY_SHARE` of their region's per-layer time are left out (a small difference such as
    W = BW - B moves a lot and the prediction little). None when no region records a spread."""
    best = None
    for r in profile.regions:
        total = r.forward_ms + r.backward_ms + r.weight_ms
        for k, v in r.spread:
            if k.startswith("head_") or getattr(r, k) < SUMMARY_SHARE * total:
                continue
            if best is None or v > best[0]:
                best = (v, f"{r.name}.{k}")
    return best


def parse_tied(obj, depths: dict, where: str = "mpipe.profile.tied") -> Tuple[TiedWeight, ...]:
    """``tied: [{name, region, layers: [0, L-1], param_mb}]``: the tied weights, each checked (a region of the
    profile, at least two distinct layers of it, a name given once)."""
    if not isinstance(obj, list):
        raise SpecError(where, f"must be a list of {{{', '.join(TIED_KEYS)}}}, got {obj!r}")
    out, names = [], set()
    for i, t in enumerate(obj):
        w = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise SpecError(w, "must be a mapping with keys " + ", ".join(TIED_KEYS))
        if set(t) - set(TIED_KEYS):
            raise unknown_key(w, t, TIED_KEYS)
        for k in ("name", "region", "layers"):
            if k not in t:
                raise SpecError(f"{w}.{k}", "missing")
        if not isinstance(t["name"], str) or not t["name"] or t["name"] in names:
            raise SpecError(f"{w}.name", f"must be a non-empty name given once, got {t['name']!r}")
        if t["region"] not in depths:
            raise SpecError(f"{w}.region", f"{t['region']!r} unknown; allowed: {', '.join(depths)}")
        layers = t["layers"]
        if (not isinstance(layers, list) or len(set(map(repr, layers))) < 2
                or any(not is_whole(x) or not 0 <= x < depths[t["region"]]
                       for x in layers)):
            raise SpecError(f"{w}.layers", f"{layers!r}: give two or more distinct layers of {t['region']!r} "
                                           f"(0..{depths[t['region']] - 1}), one per copy")
        names.add(t["name"])
        out.append(TiedWeight(t["name"], t["region"], tuple(layers),
                              _at_most(f"{w}.param_mb", t.get("param_mb", 0.0), bounds.MAX_COST)))
    return tuple(out)


MACHINE_KEYS = ("cpu", "cores", "device", "mindspore")


def _measured_on(obj, where: str):
    """``measured_on: {cpu: ..., cores: N, device: CPU|Ascend, mindspore: 2.9.0}`` as sorted pairs."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise SpecError(where, "must be a mapping with keys " + ", ".join(MACHINE_KEYS))
    unknown = set(obj) - set(MACHINE_KEYS)
    if unknown:
        raise unknown_key(where, obj, MACHINE_KEYS)
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise SpecError(f"{where}.{k}", f"must be a string or a whole number, got {v!r}")
    return tuple(sorted(obj.items()))


def machine_differences(measured_on, here: dict) -> list:
    """``key: profile value != this machine's`` for every machine key that differs (``measured_on``
    as stored in :class:`ModelProfile`; ``here`` from :func:`hyperparallel.bench.machine.this_machine`)."""
    there = dict(measured_on or ())
    return [f"{k}: {there[k]!r} != {here.get(k)!r}" for k in MACHINE_KEYS
            if k in there and str(there[k]) != str(here.get(k))]
