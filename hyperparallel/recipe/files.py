"""Recipe files: YAML with MindFormers' ``base_config`` inheritance, and ``--set`` overrides.

``base_config`` parents are merged as MindFormers' ``MindFormerConfig`` merges them (a test loads
every shipped recipe with MindFormers' own class and compares). ``--set a.b=v`` overrides any
value (``v`` is parsed as YAML; list items are addressed by index, e.g.
``mpipe.profile.regions.0.trainable=false``).
"""
from __future__ import annotations

import os
from typing import Tuple

import yaml

from ..mpipe.errors import SpecError


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


def check_override_key(raw: dict, item: str, known=(), open_prefixes=()) -> None:
    """Refuse a ``--set`` whose key neither is in the recipe ``raw`` nor is one of ``known`` (keys the
    reader of the recipe looks for) nor lies under one of ``open_prefixes`` (sections whose own parser
    refuses unknown keys). The message names the key and the keys that exist where it points."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise SpecError("--set", f"expected key.path=value, got {item!r}")
    key = item.split("=", 1)[0].strip()
    if key in known or any(key.startswith(p + ".") for p in open_prefixes):
        return
    node, parts = raw, key.split(".")
    for i, p in enumerate(parts):
        if isinstance(node, list) and p.isdigit() and int(p) < len(node):
            node = node[int(p)]
            continue
        if isinstance(node, dict) and p in node:
            node = node[p]
            continue
        where = ".".join(parts[:i]) or "the recipe"
        have = ", ".join(map(str, node)) if isinstance(node, dict) else (f"a list of {len(node)}" if
                                                                        isinstance(node, list) else "a value")
        raise SpecError(f"--set {key}", f"unknown key: {where} has no {p!r} (it has: {have})")


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


def load_raw(path: str) -> dict:
    """The file as a dict, its ``base_config`` parents merged."""
    return _load_yaml(path)
