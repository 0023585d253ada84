"""Recipes: MindFormers YAML with a ``parallel_config`` and an ``mpipe:`` section.

Only this module reads recipe files. Files are loaded with MindFormers' own
``MindFormerConfig`` when MindFormers is installed (``base_config`` inheritance exactly
as in MindFormers, and without importing MindSpore: see :mod:`.mfconfig`), else with
the built-in loader below, which implements the same merge. ``--set a.b=v`` overrides
any value (``v`` is parsed as YAML; list items are addressed by index, e.g.
``mpipe.profile.regions.0.trainable=false``).

Keys read: ``parallel_config.{pipeline_stage, micro_batch_num, data_parallel}``,
``pp_interleave_num`` from ``parallel_config`` (hyperparallel's spelling) or
``model.model_config`` (MindFormers 1.9's), ``device``, and the ``mpipe:`` section:

* ``schedule``: short name or list form (see :mod:`.schedule`);
* ``profile``: per-region costs; optional when ``model.model_config`` gives the layer
  counts (``num_hidden_layers``/``num_layers``, and ``vision_config.depth`` or
  ``.num_hidden_layers`` for the encoder), then every layer costs one unit;
* ``encoder``: ``{owners, backward, spill, trainable}``, options of the encoder regions
  (the transpose options fill in what the schedule does not say; ``trainable`` sets
  every region before the pipelined one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

import yaml

from .errors import SpecError
from .profile import ModelProfile, parse_profile

MPIPE_KEYS = ("schedule", "profile", "encoder")
ENCODER_KEYS = ("owners", "backward", "spill", "trainable")
SCHEDULERS = ("gpipe", "1f1b", "seqpipe", "seqvpp", "seqsmartvpp", "zero_bubble_v")  # MindSpore's
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
    loader: str = "builtin"          # "mindformers" (MindFormerConfig) or "builtin"
    encoder: dict = field(default_factory=dict)   # mpipe.encoder options

    def resolve_schedule(self, schedule):
        """``schedule`` (e.g. a ``--schedule`` value) with the recipe's ``mpipe.encoder`` options applied."""
        return apply_encoder_options(schedule, self.encoder)


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


def _load_yaml(path: str, seen=()) -> dict:
    if not os.path.isfile(path):
        raise SpecError("recipe", f"file not found: {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise SpecError("recipe", f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise SpecError("recipe", f"{path} must be a YAML mapping")
    base = raw.pop("base_config", None)
    if base:
        # MindFormers-style inheritance: the base is loaded first, this file's keys win (deep merge).
        # Several bases are combined as MindFormerConfig does: top-level keys, later bases win.
        bases = base if isinstance(base, list) else [base]
        merged: dict = {}
        for b in bases:
            bp = os.path.join(os.path.dirname(path), b)
            if os.path.abspath(bp) in seen:
                raise SpecError("base_config", f"inheritance cycle at {b}")
            merged.update(_load_yaml(bp, seen + (os.path.abspath(path),)))
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
    """(merged dict, loader name): MindFormerConfig when MindFormers is installed, else built-in."""
    from . import mfconfig
    if not os.path.isfile(path):
        raise SpecError("recipe", f"file not found: {path}")
    try:
        raw = mfconfig.load_config_dict(path)
    except RecursionError:
        raise SpecError("base_config", f"inheritance cycle below {path}") from None
    if raw is not None:
        if not isinstance(raw, dict):
            raise SpecError("recipe", f"{path} must be a YAML mapping")
        return raw, "mindformers"
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


def _profile_from_model_config(raw: dict) -> Optional[dict]:
    """Unit-cost profile from MindFormers' ``model.model_config`` layer counts, or None."""
    mc = _model_config(raw)
    llm = mc.get("num_hidden_layers", mc.get("num_layers"))
    if not isinstance(llm, int) or isinstance(llm, bool):
        return None
    unit = dict(forward_ms=1.0, backward_ms=1.0, weight_ms=1.0, activation_mb=1.0, output_mb=1.0, param_mb=1.0)
    regions = []
    vc = mc.get("vision_config")
    if isinstance(vc, dict):
        depth = vc.get("depth", vc.get("num_hidden_layers"))
        if isinstance(depth, int) and not isinstance(depth, bool):
            regions.append(dict(name="vision", layers=depth, trainable=True, **unit))
    regions.append(dict(name="llm", layers=llm, trainable=True, **unit))
    return {"regions": regions}


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

    def whole(key: str, default=None) -> int:
        v = pc.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"parallel_config.{key}", f"must be a whole number >= 1, got {v!r}")
        return v

    mc_v = _model_config(raw).get("pp_interleave_num")
    if mc_v is not None:
        if "pp_interleave_num" in pc and pc["pp_interleave_num"] != mc_v:
            raise SpecError("parallel_config.pp_interleave_num",
                            f"{pc['pp_interleave_num']!r} differs from model.model_config.pp_interleave_num "
                            f"{mc_v!r}; give one of them")
        pc = dict(pc, pp_interleave_num=mc_v)

    mp = raw.get("mpipe")
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
    if prof is None:
        prof = _profile_from_model_config(raw)
        if prof is None:
            raise SpecError("mpipe.profile", "missing; give the regions with their per-layer costs (or "
                                             "model.model_config.num_hidden_layers for a unit-cost profile)")
    if "trainable" in enc and isinstance(prof, dict) and isinstance(prof.get("regions"), list):
        regs = [dict(r) if isinstance(r, dict) else r for r in prof["regions"]]
        for r in regs[:-1]:
            if isinstance(r, dict):
                r["trainable"] = enc["trainable"]
        prof = dict(prof, regions=regs)
    sched = mp.get("schedule", "1f1b")
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
    ppc = (raw.get("parallel") or {}).get("pipeline_config") if isinstance(raw.get("parallel"), dict) else None
    if isinstance(ppc, dict) and "pipeline_scheduler" in ppc and ppc["pipeline_scheduler"] not in SCHEDULERS:
        raise SpecError("parallel.pipeline_config.pipeline_scheduler",
                        f"{ppc['pipeline_scheduler']!r} unknown; allowed: {', '.join(SCHEDULERS)}")
    return Recipe(path=path, raw=raw, pipeline_stage=whole("pipeline_stage"),
                  micro_batch_num=whole("micro_batch_num"), pp_interleave_num=whole("pp_interleave_num", 1),
                  data_parallel=whole("data_parallel", 1), profile=parse_profile(prof),
                  schedule=apply_encoder_options(sched, enc), device=device, overrides=overrides,
                  encoder=dict(enc))


def load_recipe(path: str, overrides: Iterable[str] = ()) -> Recipe:
    """Load (MindFormerConfig or built-in), merge ``base_config`` parents, apply ``--set`` overrides, validate."""
    raw, loader = load_raw(path)
    recipe = recipe_from_dict(raw, path=path, overrides=overrides)
    recipe.loader = loader
    return recipe
