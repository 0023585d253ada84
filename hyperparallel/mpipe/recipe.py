"""Recipes: MindFormers YAML with a ``parallel_config`` and an ``mpipe:`` section.

Only this module reads recipe files. ``base_config`` inheritance is merged as MindFormers'
``MindFormerConfig`` merges it (a test loads every shipped recipe with MindFormers' own
class and compares). ``--set a.b=v`` overrides any value (``v`` is parsed as YAML; list
items are addressed by index, e.g. ``mpipe.profile.regions.0.trainable=false``).

Keys read: ``parallel_config.{pipeline_stage, micro_batch_num, data_parallel, seq_split_num}``,
``pp_interleave_num`` from ``parallel_config`` (hyperparallel's spelling) or
``model.model_config`` (MindFormers 1.9's), ``parallel.pipeline_config``, ``device``, and
the ``mpipe:`` section:

* ``schedule``: short name or list form (see :mod:`.schedule`); without it the schedule
  comes from ``parallel.pipeline_config`` (see :mod:`.mindformers_rules`);
* ``profile``: per-region costs; optional when ``model.model_config`` gives the layer
  counts (the language model's and its towers', see :func:`.mindformers_rules.towers`),
  then every layer costs one unit and ``freeze_*`` flags set ``trainable``;
* ``encoder``: ``{owners, backward, spill, trainable}``, options of the encoder regions
  (the transpose options fill in what the schedule does not say; ``trainable`` sets
  every region before the pipelined one).

A MindFormers config (``model:`` with ``model_config`` or ``arch``) is planned as MindFormers
runs it: V is 1 unless ``pipeline_interleave`` is true, and the language model's layers per
chunk follow ``model.model_config.offset`` by MindFormers' rule. The project's own recipes
split the layers evenly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Tuple

import yaml

from . import mindformers_rules as mf
from .errors import SpecError
from .profile import ModelProfile, parse_profile

MPIPE_KEYS = ("schedule", "profile", "encoder")
ENCODER_KEYS = ("owners", "backward", "spill", "trainable")
SCHEDULERS = mf.SCHEDULERS  # MindSpore's
PARALLEL_KEYS = ("pipeline_stage", "micro_batch_num", "pp_interleave_num", "data_parallel", "model_parallel",
                 "vocab_emb_dp", "gradient_aggregation_group", "use_seq_parallel", "context_parallel",
                 "expert_parallel")
DEVICES = ("CPU", "Ascend")


@dataclass
class Recipe:
    path: Optional[str]
    raw: dict
    pipeline_stage: int
    micro_batch_num: int
    pp_interleave_num: int
    data_parallel: int
    profile: ModelProfile
    schedule: object = "1f1b"
    device: str = "CPU"
    overrides: list = field(default_factory=list)
    loader: str = "builtin"
    encoder: dict = field(default_factory=dict)   # mpipe.encoder options
    v_key: str = "parallel_config.pp_interleave_num"  # the key that set V (named in errors)
    layout: Optional[dict] = None  # MindFormers layer layout of the pipelined region: num_layers, offset, key

    def resolve_schedule(self, schedule):
        """``schedule`` (e.g. a ``--schedule`` value) with the recipe's ``mpipe.encoder`` options applied."""
        return apply_encoder_options(schedule, self.encoder)

    def chunk_layers(self, order: str) -> Optional[Tuple[int, ...]]:
        """Layers of every chunk of the pipelined region by MindFormers' rule (None: the even split)."""
        if self.layout is None:
            return None
        return mf.layer_layout(self.layout["num_layers"], self.layout["offset"], self.pipeline_stage,
                               self.pp_interleave_num, self.layout["key"], zbv=order == "zbv")

    def plan_schedule(self, schedule=None):
        """The parsed schedule to derive: the recipe's (or ``schedule``, with the ``mpipe.encoder``
        options), its pipe order checked against P, V, M (errors name the key that set V), and the
        recipe's cut of the pipelined region."""
        from . import orders
        from .schedule import parse_schedule
        spec = self.schedule if schedule is None else self.resolve_schedule(schedule)
        sched = parse_schedule(spec, self.profile, V=self.pp_interleave_num)
        body, pipe = sched.body
        try:
            orders.validate(pipe.order, self.pipeline_stage, self.pp_interleave_num, self.micro_batch_num)
        except SpecError as e:
            if e.field == "parallel_config.pp_interleave_num" and self.v_key != e.field:
                raise SpecError(self.v_key, str(e)[len(e.field) + 2:]) from None
            raise
        layers = self.chunk_layers(pipe.order)
        if layers is None:
            return sched
        if pipe.layers is not None and tuple(pipe.layers) != layers:
            raise SpecError(f"schedule.{body}.layers", f"{list(pipe.layers)} contradicts {self.layout['key']} "
                                                       f"(layers per chunk {list(layers)}); give it in one place")
        parts = sched.parts[:-1] + ((body, replace(pipe, layers=layers)),)
        return replace(sched, parts=parts)


def apply_override(raw: dict, item: str) -> None:
    """Apply one ``key.path=value`` override in place."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise SpecError("--set", f"expected key.path=value, got {item!r}")
    key, text = item.split("=", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    parts = key.strip().split(".")
    node = raw
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not p.isdigit() or int(p) >= len(node):
                raise SpecError(f"--set {key}", f"{'.'.join(parts[:i]) or 'recipe'} is a list of {len(node)}; "
                                                f"use an index 0..{len(node) - 1}")
            p = int(p)
        elif not isinstance(node, dict):
            raise SpecError(f"--set {key}", f"{'.'.join(parts[:i])} is not a mapping")
        if last:
            node[p] = value
        else:
            if isinstance(node, dict) and not isinstance(node.get(p), (dict, list)):
                node[p] = {}
            node = node[p]


def _load_yaml(path: str, chain: Tuple[str, ...] = ()) -> dict:
    """One file with its ``base_config`` parents merged as MindFormers' ``MindFormerConfig`` does.

    ``chain``: the files being loaded above this one (a file met again is an inheritance cycle).
    """
    if not os.path.isfile(path):
        raise SpecError("recipe" if not chain else "base_config", f"file not found: {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise SpecError("recipe", f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise SpecError("recipe", f"{path} must be a YAML mapping")
    chain = chain + (os.path.realpath(path),)
    base = raw.pop("base_config", None)
    if base:
        # MindFormers-style inheritance: the base is loaded first, this file's keys win (deep merge).
        # Several bases are combined as MindFormerConfig does: top-level keys, later bases win.
        bases = base if isinstance(base, list) else [base]
        merged: dict = {}
        for b in bases:
            if not isinstance(b, str):
                raise SpecError("base_config", f"{path}: must be a file name or a list of them, got {b!r}")
            bp = os.path.join(os.path.dirname(path), b)
            if os.path.realpath(bp) in chain:
                names = [os.path.basename(x) for x in chain] + [os.path.basename(bp)]
                raise SpecError("base_config", f"inheritance cycle: {' -> '.join(names)}")
            merged.update(_load_yaml(bp, chain))
        _merge(merged, raw)
        raw = merged
    return raw


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            dst[k] = dict(dst[k])  # never write into a dict shared with another base
            _merge(dst[k], v)
        else:
            dst[k] = v


def load_raw(path: str):
    """(merged dict, loader name): the file with its ``base_config`` parents merged.

    The loader name is always ``"builtin"`` (kept for callers that record it).
    """
    return _load_yaml(path), "builtin"


def _call_opts(text: str):
    from .schedule import _parse_call
    return _parse_call(text, "mpipe.schedule")


def apply_encoder_options(schedule, encoder: dict):
    """Fill the transpose options of ``schedule`` from ``mpipe.encoder`` (the schedule's own win)."""
    opts = {k: v for k, v in (encoder or {}).items() if k in ("owners", "backward", "spill")}
    if not opts or schedule is None:
        return schedule
    if isinstance(schedule, str) and not schedule.strip().startswith("["):
        name, given = _call_opts(schedule)
        if name != "transpose":
            return schedule  # the options only concern transposed encoders
        merged = dict(opts)
        merged.update(given)
        order = ["owners", "backward", "spill", "order"]
        keys = [k for k in order if k in merged] + [k for k in merged if k not in order]
        return "transpose(" + ", ".join(f"{k}={merged[k]}" for k in keys) + ")"
    if isinstance(schedule, str):
        try:
            schedule = yaml.safe_load(schedule)
        except yaml.YAMLError:
            return schedule  # parse_schedule reports it
    if isinstance(schedule, list):
        out = []
        for it in schedule:
            if isinstance(it, dict) and it.get("skeleton") == "transpose":
                it = dict(opts, **it)
            out.append(it)
        return out
    return schedule


def _model_config(raw: dict) -> dict:
    model = raw.get("model")
    mc = model.get("model_config") if isinstance(model, dict) else None
    return mc if isinstance(mc, dict) else {}


UNIT = dict(forward_ms=1.0, backward_ms=1.0, weight_ms=1.0, activation_mb=1.0, output_mb=1.0, param_mb=1.0)


def _profile_from_model_config(raw: dict) -> Optional[dict]:
    """Unit-cost profile from the layer counts of ``model.model_config`` and its towers, or None."""
    ts = mf.towers(_model_config(raw))
    if not ts:
        return None
    return {"regions": [dict(name=t.name, layers=t.layers, trainable=True, **UNIT) for t in ts]}


def _apply_freeze_flags(prof, raw: dict, enc: dict, hand_written: bool):
    """``model.model_config.freeze_vision: true`` and the like set the region's ``trainable``.

    A flag for a part that is no region of the profile (e.g. ``freeze_projector``: the projector has
    no layer count, it is the tail of the encoder region before it) changes nothing. A flag that
    contradicts ``mpipe.encoder.trainable`` or a hand-written region's ``trainable`` is refused.
    """
    flags = mf.freeze_flags(_model_config(raw))
    if not flags or not isinstance(prof, dict) or not isinstance(prof.get("regions"), list):
        return prof
    regs = [dict(r) if isinstance(r, dict) else r for r in prof["regions"]]
    for i, r in enumerate(regs):
        if not isinstance(r, dict) or r.get("name") not in flags:
            continue
        frozen, key = flags[r["name"]]
        if "trainable" in enc and i < len(regs) - 1 and enc["trainable"] == frozen:
            raise SpecError(key, f"{frozen} contradicts mpipe.encoder.trainable: {enc['trainable']}; give it in "
                                 "one place")
        if hand_written and "trainable" in r and r["trainable"] == frozen:
            raise SpecError(key, f"{frozen} contradicts mpipe.profile.regions[{i}].trainable: {r['trainable']}; "
                                 "give it in one place")
        r["trainable"] = not frozen
    return dict(prof, regions=regs)


def _layout(raw: dict, profile: ModelProfile, P: int, V: int) -> Optional[dict]:
    """MindFormers' layer layout of the pipelined region, validated now (None: not a MindFormers config)."""
    if not mf.is_mindformers_config(raw):
        return None
    mc = _model_config(raw)
    body = profile.regions[-1]
    ts = mf.towers(mc)
    llm = ts[-1] if ts else None
    num_layers, offset, key = body.layers, mc.get("offset"), "model.model_config.offset"
    if llm is not None:
        if llm.layers != body.layers:
            raise SpecError(f"mpipe.profile.regions[{len(profile.regions) - 1}].layers",
                            f"{body.layers} differs from {llm.key} ({llm.layers}); give the same layer count")
        if llm.config is not mc and "offset" in llm.config:
            offset, key = llm.config["offset"], llm.key.rsplit(".", 1)[0] + ".offset"
        if llm.layers < P * V:
            raise SpecError(llm.key, f"{llm.layers} layers cannot be cut into pipeline_stage x pp_interleave_num "
                                     f"= {P} x {V} = {P * V} chunks")
    layout = {"num_layers": num_layers, "offset": offset, "key": key}
    return layout


def recipe_from_dict(raw: dict, path: Optional[str] = None, overrides: Iterable[str] = ()) -> Recipe:
    overrides = list(overrides or ())
    for item in overrides:
        apply_override(raw, item)
    pc = raw.get("parallel_config")
    if not isinstance(pc, dict):
        raise SpecError("parallel_config", "missing; give pipeline_stage and micro_batch_num "
                                           "(and optional pp_interleave_num, data_parallel)")
    for k in ("pipeline_stage", "micro_batch_num"):
        if k not in pc:
            raise SpecError(f"parallel_config.{k}", "missing")
    is_mf = mf.is_mindformers_config(raw)
    v_key = "parallel_config.pp_interleave_num"
    mc_v = _model_config(raw).get("pp_interleave_num")
    if mc_v is not None:
        if "pp_interleave_num" in pc and pc["pp_interleave_num"] != mc_v:
            raise SpecError("parallel_config.pp_interleave_num",
                            f"{pc['pp_interleave_num']!r} differs from model.model_config.pp_interleave_num "
                            f"{mc_v!r}; give one of them")
        pc = dict(pc, pp_interleave_num=mc_v)
        v_key = "model.model_config.pp_interleave_num"

    def whole(key: str, default=None, name=None) -> int:
        v = pc.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(name or f"parallel_config.{key}", f"must be a whole number >= 1, got {v!r}")
        return v

    P, M = whole("pipeline_stage"), whole("micro_batch_num")
    V = whole("pp_interleave_num", 1, v_key)
    interleave = mf.pipeline_interleave(raw)
    if interleave is False or (interleave is None and is_mf):
        # MindFormers' LayerSetting: pp_interleave_num only counts with pipeline_interleave on
        # (MindSpore's default is off)
        V = 1
    mf.seq_split_num(raw)

    mp = raw.get("mpipe")
    if mp is None and is_mf and _profile_from_model_config(raw) is not None:
        mp = {}
    if not isinstance(mp, dict):
        raise SpecError("mpipe", "missing; add an mpipe: section (schedule, and profile unless "
                                 "model.model_config gives the layer counts)")
    unknown = sorted(set(mp) - set(MPIPE_KEYS))
    if unknown:
        raise SpecError(f"mpipe.{unknown[0]}", f"unknown key; allowed: {', '.join(MPIPE_KEYS)}")
    enc = mp.get("encoder") or {}
    if not isinstance(enc, dict):
        raise SpecError("mpipe.encoder", f"must be a mapping with keys {', '.join(ENCODER_KEYS)}")
    bad = sorted(set(enc) - set(ENCODER_KEYS))
    if bad:
        raise SpecError(f"mpipe.encoder.{bad[0]}", f"unknown key; allowed: {', '.join(ENCODER_KEYS)}")
    if "trainable" in enc and not isinstance(enc["trainable"], bool):
        raise SpecError("mpipe.encoder.trainable", f"must be true or false, got {enc['trainable']!r}")
    prof = mp.get("profile")
    hand_written = prof is not None
    if prof is None:
        prof = _profile_from_model_config(raw)
        if prof is None:
            raise SpecError("mpipe.profile", "missing; give the regions with their per-layer costs (or "
                                             "model.model_config.num_hidden_layers for a unit-cost profile)")
    prof = _apply_freeze_flags(prof, raw, enc, hand_written)
    if "trainable" in enc and isinstance(prof, dict) and isinstance(prof.get("regions"), list):
        regs = [dict(r) if isinstance(r, dict) else r for r in prof["regions"]]
        for r in regs[:-1]:
            if isinstance(r, dict):
                r["trainable"] = enc["trainable"]
        prof = dict(prof, regions=regs)
    if "schedule" in mp:
        sched = mp["schedule"]
    elif interleave is not None:
        sched = mf.order_from_keys(raw, P, V, M, v_key)  # MindFormers' scheduler keys
    else:
        sched = "1f1b"
    for opt in ("owners", "backward", "spill"):
        if opt in enc and not isinstance(enc[opt], str):
            raise SpecError(f"mpipe.encoder.{opt}", f"must be a name, got {enc[opt]!r}")
    if isinstance(sched, str) and sched.strip() and not sched.strip().startswith("["):
        name, given = _call_opts(sched)
        clash = sorted(k for k in given if k in enc and str(enc[k]) != given[k])
        if clash:
            raise SpecError(f"mpipe.encoder.{clash[0]}", f"{enc[clash[0]]!r} contradicts mpipe.schedule "
                                                         f"{sched!r}; give it in one place")
    device = raw.get("device", "CPU")
    if device not in DEVICES:
        raise SpecError("device", f"{device!r} unknown; allowed: {', '.join(DEVICES)}")
    profile = parse_profile(prof)
    recipe = Recipe(path=path, raw=raw, pipeline_stage=P, micro_batch_num=M, pp_interleave_num=V,
                    data_parallel=whole("data_parallel", 1), profile=profile,
                    schedule=apply_encoder_options(sched, enc), device=device, overrides=overrides,
                    encoder=dict(enc), v_key=v_key, layout=_layout(raw, profile, P, V))
    if recipe.layout is not None:
        # refuse a bad offset now, whatever schedule is derived later
        recipe.chunk_layers(sched if sched == "zbv" else "")
    return recipe


def load_recipe(path: str, overrides: Iterable[str] = ()) -> Recipe:
    """Load, merge ``base_config`` parents, apply ``--set`` overrides, validate."""
    raw, loader = load_raw(path)
    recipe = recipe_from_dict(raw, path=path, overrides=overrides)
    recipe.loader = loader
    return recipe
