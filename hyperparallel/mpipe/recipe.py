"""Recipes: MindFormers-style YAML with a ``parallel_config`` and an ``mpipe:`` section.

Only this module reads recipe files. ``--set a.b=v`` overrides any value
(``v`` is parsed as YAML; list items are addressed by index, e.g.
``mpipe.profile.regions.0.trainable=false``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

import yaml

from .errors import SpecError
from .profile import ModelProfile, parse_profile

MPIPE_KEYS = ("schedule", "profile")
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
        bases = base if isinstance(base, list) else [base]
        merged: dict = {}
        for b in bases:
            bp = os.path.join(os.path.dirname(path), b)
            if os.path.abspath(bp) in seen:
                raise SpecError("base_config", f"inheritance cycle at {b}")
            _merge(merged, _load_yaml(bp, seen + (os.path.abspath(path),)))
        _merge(merged, raw)
        raw = merged
    return raw


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


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

    mp = raw.get("mpipe")
    if not isinstance(mp, dict):
        raise SpecError("mpipe", "missing; give mpipe.schedule and mpipe.profile")
    unknown = sorted(set(mp) - set(MPIPE_KEYS))
    if unknown:
        raise SpecError(f"mpipe.{unknown[0]}", f"unknown key; allowed: {', '.join(MPIPE_KEYS)}")
    if "profile" not in mp:
        raise SpecError("mpipe.profile", "missing; give the regions with their per-layer costs")
    device = raw.get("device", "CPU")
    if device not in DEVICES:
        raise SpecError("device", f"{device!r} unknown; allowed: {', '.join(DEVICES)}")
    return Recipe(path=path, raw=raw, pipeline_stage=whole("pipeline_stage"),
                  micro_batch_num=whole("micro_batch_num"), pp_interleave_num=whole("pp_interleave_num", 1),
                  data_parallel=whole("data_parallel", 1), profile=parse_profile(mp["profile"]),
                  schedule=mp.get("schedule", "1f1b"), device=device, overrides=overrides)


def load_recipe(path: str, overrides: Iterable[str] = ()) -> Recipe:
    """Load, merge ``base_config`` parents, apply ``--set`` overrides, validate."""
    return recipe_from_dict(_load_yaml(path), path=path, overrides=overrides)
