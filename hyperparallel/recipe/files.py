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

from ..errors import SpecError


def apply_override(raw: dict, item: str) -> None:
    """Apply one ``key.path=value`` override in place."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise SpecError("--set", f"expected key.path=value, got {item!r}")
    key, text = item.split("=", 1)
    loader = None
    try:
        loader = _StrictLoader(text, "the value", f"--set {key.strip()}")
        value = loader.get_single_data() if text.strip() else ""
    except yaml.YAMLError:
        value = text
    except RecursionError:
        raise SpecError(f"--set {key.strip()}", "the value is nested too deep") from None
    finally:
        if loader is not None:
            loader.dispose()
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


# bounds of one recipe file (far beyond any real config; README "Bad input")
MAX_FILE_BYTES = 16 * 1024 * 1024   # one YAML file
MAX_DEPTH = 64                      # nesting of mappings and lists
MAX_NODES = 200_000                 # values of one file, aliases expanded (a YAML "billion laughs" stops here)
MAX_BASE_CHAIN = 32                 # base_config files above a recipe


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses what it would silently accept or crash on: a key given twice in
    one mapping, nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_NODES` values with aliases
    expanded, and an alias that contains itself."""

    def __init__(self, stream, path: str, field: str):
        super().__init__(stream)
        self._path, self._field, self._depth = path, field, 0

    def _refuse(self, mark, what: str) -> SpecError:
        where = f" line {mark.line + 1}" if mark is not None else ""
        return SpecError(self._field, f"{self._path}{where}: {what}")

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise self._refuse(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _count(self, root) -> None:
        """Values under ``root`` with aliases expanded (each shared node counted once per use)."""
        sizes, open_ = {}, set()

        def size(node) -> int:
            key = id(node)
            if key in sizes:
                return sizes[key]
            if key in open_:
                raise self._refuse(node.start_mark, "an alias refers to the value that contains it")
            open_.add(key)
            n = 1
            if isinstance(node, yaml.MappingNode):
                n += sum(size(k) + size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                n += sum(size(v) for v in node.value)
            open_.discard(key)
            if n > MAX_NODES:
                raise self._refuse(node.start_mark, f"more than {MAX_NODES:,} values (aliases expanded)")
            sizes[key] = n
            return n
        size(root)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    seen = first.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue
                if seen is not key_node.start_mark:
                    raise self._refuse(key_node.start_mark, f"key {key!r} given twice in one mapping (first on "
                                                            f"line {seen.line + 1}); give it once")
        return super().construct_mapping(node, deep)

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        self._count(node)
        return self.construct_document(node)


def _read_text(path: str, field: str) -> str:
    """The file's text: UTF-8 (a byte-order mark allowed), at most :data:`MAX_FILE_BYTES`."""
    if os.path.isdir(path):
        raise SpecError(field, f"{path} is a directory, not a YAML file")
    if not os.path.isfile(path):
        raise SpecError(field, f"file not found: {path}")
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise SpecError(field, f"{path} is {size:,} bytes, above the bound {MAX_FILE_BYTES:,} for one recipe file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SpecError(field, f"{path} cannot be read: {e.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(field, f"{path} line {line}, column {col} (byte {e.start}, 0x{data[e.start]:02x}): not "
                               "UTF-8; save the file as UTF-8") from None


def parse_yaml(text: str, path: str, field: str = "recipe"):
    """``text`` loaded by the strict loader; every YAML error is a one-line refusal naming ``path`` and the line."""
    loader = None
    try:
        loader = _StrictLoader(text, path, field)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(field, f"{path}{where} is not valid YAML: {what}") from None
    except RecursionError:
        raise SpecError(field, f"{path}: nested too deep to read") from None
    finally:
        if loader is not None:
            loader.dispose()


def _load_yaml(path: str, chain: Tuple[str, ...] = ()) -> dict:
    """One file with its ``base_config`` parents merged as MindFormers' ``MindFormerConfig`` does.

    ``chain``: the files being loaded above this one (a file met again is an inheritance cycle).
    """
    field = "recipe" if not chain else "base_config"
    if len(chain) > MAX_BASE_CHAIN:
        raise SpecError("base_config", f"more than {MAX_BASE_CHAIN} files inherit from each other above "
                                       f"{os.path.basename(chain[0])} (bound; see README 'Bad input')")
    raw = parse_yaml(_read_text(path, field), path, field)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise SpecError(field, f"{path} must be a YAML mapping, got {type(raw).__name__}")
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
