"""The search space of ``hyperparallel tune``: every candidate is a schedule spec of the algebra plus
the recipe keys that make it (V, M at a fixed global batch, the LLM's layer split).

Dimensions (each from the algebra's own registries, nothing hard-coded per schedule):

* the pipe order of the LLM: every entry of :data:`hyperparallel.mpipe.orders.ORDERS` whose V and
  least M fit (``interleaved`` at V = 1 is 1F1B's rule and is left out);
* V (chunks per device): 1 .. min(``MAX_V``, LLM layers // P);
* M (micro-batches per step): every divisor of the step's samples per data-parallel replica
  (``micro_batch_num x micro-batch size``), the micro-batch size becoming samples / M;
* the encoder regions: ``place`` on device 0 (the 1F1B-style baseline) or ``transpose`` with every
  owner policy, and ``backward`` owner/central (encoder trained) or ``spill`` none/next_step (frozen);
* the LLM's layer split: every composition when there are at most ``ALL_SPLITS_MAX`` of them, else the
  even split (remainder early, as the cut does), the remainder late, a load-balanced split and the
  recipe's own; the search refines the best ones by moving single layers (:mod:`.search`);
* T (``parallel_config.model_parallel``): the values the command allows (those the model can split its
  language model into: heads, MLP channels, vocabulary; the recipe's alone by default), at the recipe's P
  and D, so a larger T uses T times the ranks (P x D x T); costed on one rank of each T group
  (:func:`~hyperparallel.mpipe.cost.tensor_parallel_profile`);
* recompute of the LLM: the recipe's alone by default, or ``none`` and ``full`` (``mpipe.recompute``).

Per-micro-batch costs at another micro-batch size (forward/backward/weight times, heads, activations,
outputs) come from the profiles measured at known sizes (the recipe's own, at the size its
``micro_batch_size`` records or else the recipe's, and any ``--profile`` files): exact at a measured
size, piecewise linear between measured sizes and beyond them along the nearest segment, and
proportional to the size when only one size is known. Parameters, the link, device speeds and the
runtime's own time per action and per step are those of the nearest measured size. A candidate's recipe is the loaded recipe with :meth:`Space.keys` merged in and read
by the recipe loader, exactly what the overlay (:mod:`.overlay`) holds.
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, replace
from math import comb
from typing import Dict, Iterator, List, Optional, Tuple

from ..mpipe import orders
from ..mpipe.cost import tensor_parallel_profile
from ..mpipe.cut import split_layers
from ..errors import SpecError, whole
from ..mpipe.profile import COST_KEYS, ModelProfile, task_ms
from ..mpipe.schedule import Pipe, Place, Schedule, Transpose, OWNERS, BACKWARDS, SPILLS
from ..recipe.mindformers import RECOMPUTE_KEY, offset_of
from ..recipe.recipe import Recipe, recipe_from_dict
from ..recipe.schema import value_at

MAX_V = 4
ALL_SPLITS_MAX = 24
#: Micro-batch size keys, in the order their value is read (the runtime reads ``data.micro_batch_size``).
BATCH_KEYS = ("data.micro_batch_size", "model.model_config.batch_size", "runner_config.batch_size")
#: Per-micro-batch cost fields of a region, scaled with the micro-batch size.
SCALED = ("forward_ms", "backward_ms", "weight_ms", "head_forward_ms", "head_backward_ms", "head_weight_ms",
          "activation_mb", "output_mb")


def put(tree: dict, key: str, value) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        tree = tree.setdefault(p, {})
    tree[parts[-1]] = value


def merge(dst: dict, src: dict) -> dict:
    """``src`` deep-merged over ``dst`` in place (as a ``base_config`` child over its parent)."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


# -- the global batch -------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """The step's samples per data-parallel replica, ``micro_batch_num x micro-batch size``, and the
    recipe keys that hold the micro-batch size (none: one sample per micro-batch is assumed)."""

    M0: int
    size0: int
    keys: Tuple[Tuple[str, int], ...]
    fixed: str = ""   # why M is held at the recipe's (empty: it is searched)

    @property
    def samples(self) -> int:
        return self.M0 * self.size0

    def sizes(self, M: int) -> Optional[Dict[str, int]]:
        """The batch keys' values at M (None: not a whole number for one of them)."""
        if self.fixed and M != self.M0:
            return None
        if self.samples % M:
            return None
        out = {}
        for key, v in self.keys:
            if (v * self.M0) % M:
                return None
            out[key] = v * self.M0 // M
        return out

    def to_json(self) -> dict:
        return {"micro_batch_num": self.M0, "micro_batch_size": self.size0, "samples_per_replica": self.samples,
                "keys": [k for k, _ in self.keys], "implied_size": not self.keys, "fixed": self.fixed or None}


def batch_of(recipe: Recipe) -> Batch:
    keys = []
    for k in BATCH_KEYS:
        v = value_at(recipe.raw, k)
        if v is None:
            continue
        whole(k, v)
        keys.append((k, v))
    fixed = ""
    if not keys and isinstance(recipe.raw.get("data"), dict):
        fixed = "the recipe's data section gives no micro_batch_size (its default would not change with M)"
    return Batch(recipe.micro_batch_num, keys[0][1] if keys else 1, tuple(keys), fixed)


def scaled_profile(profile: ModelProfile, k: float) -> ModelProfile:
    if k == 1:
        return profile
    return replace(profile, regions=tuple(replace(r, **{f: getattr(r, f) * k for f in SCALED})
                                          for r in profile.regions))


def profile_at_size(points: Dict[int, ModelProfile], size: int) -> ModelProfile:
    """The profile at micro-batch ``size`` from profiles measured at ``points`` (size -> profile): see the
    module docstring. Costs are clamped at 0 (a segment extrapolated far down may cross it)."""
    if size in points:
        return replace(points[size], micro_batch_size=size)
    sizes = sorted(points)
    near = points[min(sizes, key=lambda x: (abs(x - size), -x))]
    if len(sizes) == 1:
        return replace(scaled_profile(near, size / sizes[0]), micro_batch_size=size)
    lo = max([x for x in sizes if x < size], default=sizes[0])
    hi = min([x for x in sizes if x > size], default=sizes[-1])
    if lo == hi:
        lo, hi = (sizes[0], sizes[1]) if size < sizes[0] else (sizes[-2], sizes[-1])
    t = (size - lo) / (hi - lo)
    regions = []
    for r, a, b in zip(near.regions, points[lo].regions, points[hi].regions):
        regions.append(replace(r, **{f: max(0.0, getattr(a, f) + (getattr(b, f) - getattr(a, f)) * t) for f in SCALED}))
    return replace(near, regions=tuple(regions), micro_batch_size=size)


def check_points(recipe_profile: ModelProfile, extra: Dict[str, ModelProfile]) -> None:
    """Every ``--profile`` has the recipe's regions (names, layers, trainable) and records its size."""
    want = [(r.name, r.layers, r.trainable) for r in recipe_profile.regions]
    for where, p in extra.items():
        if p.micro_batch_size is None:
            raise SpecError(f"--profile {where}", "mpipe.profile.micro_batch_size missing: give the micro-batch size "
                                                  "its costs were measured at (hyperparallel profile and bench write it)")
        got = [(r.name, r.layers, r.trainable) for r in p.regions]
        if got != want:
            raise SpecError(f"--profile {where}", f"regions (name, layers, trainable) {got} differ from the recipe's "
                                                  f"{want}")


def profile_dict(profile: ModelProfile) -> dict:
    """The ``mpipe.profile`` mapping of ``profile`` (what :func:`~hyperparallel.mpipe.profile.parse_profile` reads)."""
    regions = []
    for r in profile.regions:
        d = {"name": r.name, "layers": r.layers, "trainable": r.trainable}
        d.update({k: getattr(r, k) for k in COST_KEYS if k != "whole_param_mb" or r.whole_param_mb})
        if r.spread:
            d["spread"] = dict(r.spread)
        regions.append(d)
    out = {"link": {"latency_ms": profile.link.latency_ms, "bandwidth_gb_s": profile.link.bandwidth_gb_s},
           "optimizer_factor": profile.optimizer_factor, "regions": regions}
    if profile.measured_on:
        out["measured_on"] = dict(profile.measured_on)
    if profile.device_scale:
        out["device_scale"] = list(profile.device_scale)
    if profile.tensor_link is not None:
        out["tensor_link"] = {"latency_ms": profile.tensor_link.latency_ms,
                              "bandwidth_gb_s": profile.tensor_link.bandwidth_gb_s}
    if profile.action_overhead_ms:
        out["action_overhead_ms"] = profile.action_overhead_ms
    if profile.step_overhead_ms:
        out["step_overhead_ms"] = profile.step_overhead_ms
    if profile.micro_batch_size is not None:
        out["micro_batch_size"] = profile.micro_batch_size
    if profile.repeats is not None:
        out["repeats"] = profile.repeats
    return out


# -- candidates -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Encoder:
    """The skeleton of every region before the LLM: ``place`` (device 0) or ``transpose`` with options."""

    skeleton: str
    owners: str = "round_robin"
    backward: str = "owner"
    spill: str = "none"

    def skeleton_of(self):
        if self.skeleton == "place":
            return Place(device=0)
        return Transpose(owners=self.owners, backward=self.backward, spill=self.spill)


@dataclass(frozen=True)
class Candidate:
    order: str
    V: int
    M: int
    encoder: Optional[Encoder]   # None: the model has no region before the LLM
    layers: Tuple[int, ...]      # the LLM's layers per chunk, data-flow order
    split: str = "even"          # how the split was made: even, late, balanced, recipe, all, moved
    T: int = 1                   # tensor-parallel ranks of each stage (parallel_config.model_parallel)
    recompute: Optional[str] = None   # the LLM's mpipe.recompute (None: the recipe's own)

    @property
    def family(self) -> tuple:
        """Everything but the layer split."""
        return (self.order, self.V, self.M, self.encoder, self.T, self.recompute)

    @property
    def spill(self) -> bool:
        return self.encoder is not None and self.encoder.spill == "next_step"


def compositions(total: int, parts: int) -> Iterator[Tuple[int, ...]]:
    """Every split of ``total`` layers into ``parts`` chunks of >= 1 layer."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = (0,) + cuts + (total,)
        yield tuple(b[i + 1] - b[i] for i in range(parts))


class Space:
    """The candidates of one recipe and how each becomes a recipe (see the module docstring)."""

    def __init__(self, recipe: Recipe, max_v: int = MAX_V, all_splits_max: int = ALL_SPLITS_MAX,
                 profiles: Optional[Dict[str, ModelProfile]] = None, tensor_parallel: Tuple[int, ...] = (),
                 recompute: Tuple[Optional[str], ...] = (None,)):
        self.recipe = recipe
        self.Ts = sorted(set(tensor_parallel)) or [recipe.tensor_parallel]
        self.recomputes = list(recompute)
        self.P, self.D = recipe.pipeline_stage, recipe.data_parallel
        self.M0, self.V0 = recipe.micro_batch_num, recipe.pp_interleave_num
        self.profile = recipe.profile
        self.body = recipe.profile.regions[-1]
        self.ups = [r.name for r in recipe.profile.regions[:-1]]
        self.L = self.body.layers
        if self.L < self.P:
            i = len(recipe.profile.regions) - 1
            raise SpecError(f"mpipe.profile.regions[{i}].layers",
                            f"{self.body.name!r} has {self.L} layers, cannot cut into pipeline_stage = {self.P} "
                            "chunks: the model cannot be planned on these devices")
        self.mf = recipe.layout is not None
        self.batch = batch_of(recipe)
        check_points(recipe.profile, profiles or {})
        #: measured sizes -> profile: the recipe's own, then every --profile (one at a size replaces it)
        self.points: Dict[int, ModelProfile] = {recipe.profile.micro_batch_size or self.batch.size0: recipe.profile}
        self.points.update({p.micro_batch_size: p for p in (profiles or {}).values()})
        self.profile_files = dict(profiles or {})
        self.all_splits_max = all_splits_max
        self.Vs = list(range(1, max(1, min(max_v, self.L // self.P)) + 1))
        self.Ms = [M for M in range(1, self.batch.samples + 1) if self.batch.sizes(M) is not None]
        trained = any(r.trainable for r in recipe.profile.regions[:-1])
        if not self.ups:
            self.encoders: List[Optional[Encoder]] = [None]
        elif trained:
            self.encoders = [Encoder("place")] + [Encoder("transpose", o, b) for o in OWNERS for b in BACKWARDS]
        else:
            self.encoders = [Encoder("place")] + [Encoder("transpose", o, spill=s) for o in OWNERS for s in SPILLS]
        self._recipes: Dict[tuple, Recipe] = {}
        self._profiles: Dict[int, ModelProfile] = {}

    # -- dimensions --------------------------------------------------------------------------
    def orders_at(self, V: int, M: int) -> List[str]:
        out = []
        for name, o in orders.ORDERS.items():
            if (o.V is not None and o.V != V) or (name == "interleaved" and V == 1):
                continue
            if M < o.min_micro(self.P, V):
                continue
            out.append(name)
        return out

    def families(self) -> Iterator[tuple]:
        for T in self.Ts:
            for rec in self.recomputes:
                for V in self.Vs:
                    for M in self.Ms:
                        for order in self.orders_at(V, M):
                            for enc in self.encoders:
                                yield order, V, M, enc, T, rec

    def rank_profile(self, c: Candidate) -> ModelProfile:
        """The profile of one rank of ``c`` (its M's micro-batch size; the LLM split over ``c.T``)."""
        return tensor_parallel_profile(self.profile_at(c.M), c.T, (self.body.name,))

    def profile_at(self, M: int) -> ModelProfile:
        """The profile of candidates with M micro-batches (micro-batch size samples / M)."""
        if M not in self._profiles:
            size = self.batch.samples // M
            own = self.recipe.profile.micro_batch_size or self.batch.size0
            same = size == own and self.points[own] is self.recipe.profile
            self._profiles[M] = self.recipe.profile if same else profile_at_size(self.points, size)
        return self._profiles[M]

    def even(self, V: int) -> Tuple[int, ...]:
        return tuple(split_layers(self.L, self.P * V))

    def splits(self, order: str, V: int, M: int, enc: Optional[Encoder]) -> List[Tuple[Tuple[int, ...], str]]:
        """The base layer splits of a family: every composition when they are few, else even, late,
        balanced and the recipe's own (at the recipe's V)."""
        n = self.P * V
        if comb(self.L - 1, n - 1) <= self.all_splits_max:
            return [(s, "all") for s in compositions(self.L, n)]
        out = [(self.even(V), "even"), (tuple(reversed(self.even(V))), "late"),
               (self.balanced(order, V, M, enc), "balanced")]
        if V == self.V0:
            own = self.recipe_split(order)
            if own is not None:
                out.append((own, "recipe"))
        seen, uniq = set(), []
        for s, how in out:
            if s not in seen:
                seen.add(s)
                uniq.append((s, how))
        return uniq

    def recipe_split(self, order: str) -> Optional[Tuple[int, ...]]:
        """The recipe's own split at its V: MindFormers' offset layout, or the schedule's ``layers``."""
        if self.mf:
            return tuple(self.recipe.chunk_layers(order))
        try:
            pipe = self.recipe.plan_schedule().body[1]
        except SpecError:
            return None
        return tuple(pipe.layers) if pipe.layers is not None else None

    def balanced(self, order: str, V: int, M: int, enc: Optional[Encoder]) -> Tuple[int, ...]:
        """Layers handed out one at a time to the chunk whose device would then carry the least work:
        the LLM's per-layer work, the head on the last chunk, a placed encoder's work on device 0,
        each device's speed (``device_scale``)."""
        prof = self.profile_at(M)
        body = prof.regions[-1]
        n = self.P * V
        scale = [prof.device_scale[d] if prof.device_scale else 1.0 for d in range(self.P)]
        kinds = ("F", "BW") if body.trainable else ("F",)
        per_layer = M * sum(task_ms(body, k, 1) for k in kinds)
        head = M * sum(task_ms(body, k, 0, head=True) for k in kinds)
        dev = [orders.device_of(order, c, self.P) for c in range(n)]
        load = [0.0] * self.P
        if enc is not None and enc.skeleton == "place":
            for name in self.ups:
                r = prof.region(name)
                load[0] += M * sum(task_ms(r, k, r.layers, head=True) for k in (("F", "BW") if r.trainable else ("F",)))
        layers = [1] * n
        for c in range(n):
            load[dev[c]] += per_layer + (head if c == n - 1 else 0.0)
        for _ in range(self.L - n):
            c = min(range(n), key=lambda c: ((load[dev[c]] + per_layer) * scale[dev[c]], layers[c], c))
            layers[c] += 1
            load[dev[c]] += per_layer
        return tuple(layers)

    def candidates(self) -> Iterator[Candidate]:
        for order, V, M, enc, T, rec in self.families():
            for layers, how in self.splits(order, V, M, enc):
                yield Candidate(order, V, M, enc, layers, how, T, rec)

    def size(self) -> int:
        return sum(1 for _ in self.candidates())

    # -- a candidate as a schedule and as recipe keys -----------------------------------------
    def schedule(self, c: Candidate) -> Schedule:
        layers = None if (self.mf or c.layers == self.even(c.V)) else c.layers
        parts = [(r, c.encoder.skeleton_of()) for r in self.ups]
        return Schedule(tuple(parts + [(self.body.name, Pipe(order=c.order, layers=layers))]))

    def spelling(self, c: Candidate) -> str:
        return self.schedule(c).name()

    def offset(self, c: Candidate):
        return offset_of(c.layers, self.P, c.V, zbv=c.order == "zbv")

    def keys(self, c: Candidate, with_schedule: bool = True) -> dict:
        """The recipe keys of ``c``, nested (what the overlay writes over ``base_config``)."""
        out: dict = {}
        put(out, "parallel_config.micro_batch_num", c.M)
        put(out, self.recipe.v_key, c.V)
        for key, v in (self.batch.sizes(c.M) or {}).items():
            put(out, key, v)
        if self.profile_at(c.M) is not self.recipe.profile:
            put(out, "mpipe.profile", profile_dict(self.profile_at(c.M)))
        if c.T != self.recipe.tensor_parallel:
            put(out, "parallel_config.model_parallel", c.T)
        if c.recompute is not None:
            put(out, "mpipe.recompute", c.recompute)
            if value_at(self.recipe.raw, RECOMPUTE_KEY) is not None:   # one place: mpipe.recompute
                put(out, RECOMPUTE_KEY, False)
        if self.mf:
            put(out, self.recipe.layout["key"], self.offset(c))
            ppc = value_at(self.recipe.raw, "parallel.pipeline_config")
            if c.V > 1 or isinstance(ppc, dict):
                ms = orders.ORDERS[c.order].mindspore
                sched = ms[0] if ms else (ppc or {}).get("pipeline_scheduler", "1f1b")
                put(out, "parallel.pipeline_config", {"pipeline_interleave": c.V > 1, "pipeline_scheduler": sched})
        if with_schedule:
            sched = self.schedule(c)
            put(out, "mpipe.schedule", sched.name() if sched.body[1].layers is None else sched.to_list())
            if c.encoder is not None and c.encoder.skeleton == "transpose":
                put(out, "mpipe.encoder", {"owners": c.encoder.owners, "backward": c.encoder.backward,
                                           "spill": c.encoder.spill})
        return out

    def recipe_for(self, c: Candidate) -> Recipe:
        """The recipe of ``c``'s V, M (and, for a MindFormers config, layer split): the loaded recipe with
        :meth:`keys` merged in, read by the recipe loader (the schedule is passed to the derivation)."""
        key = (c.V, c.M, c.layers if self.mf else None, c.order == "zbv" if self.mf else None, c.T, c.recompute)
        if key not in self._recipes:
            raw = merge(copy.deepcopy(self.recipe.raw), self.keys(c, with_schedule=False))
            # parsed as the loaded recipe was (a run config's ParsedRecipe stays one)
            self._recipes[key] = recipe_from_dict(raw, path=self.recipe.path, cls=type(self.recipe))
        return self._recipes[key]

    def describe(self) -> dict:
        """How the space grows: its dimensions and their sizes."""
        orders_by_v = {V: sorted({o for M in self.Ms for o in self.orders_at(V, M)}, key=list(orders.ORDERS).index)
                       for V in self.Vs}
        return {"orders": list(orders.ORDERS), "orders_by_V": {str(V): o for V, o in orders_by_v.items()},
                "V": self.Vs, "M": self.Ms, "encoders": [_enc_name(e) for e in self.encoders],
                "T": self.Ts, "recompute": [r or "recipe" for r in self.recomputes],
                "splits_all_when_at_most": self.all_splits_max, "families": sum(1 for _ in self.families()),
                "base_candidates": self.size()}


def _enc_name(e: Optional[Encoder]) -> str:
    if e is None:
        return "-"
    if e.skeleton == "place":
        return "place(device=0)"
    return f"transpose(owners={e.owners}, backward={e.backward}, spill={e.spill})"
