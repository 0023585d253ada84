"""Schedule algebra: per-region skeletons and the short names that expand to them.

A schedule is a list of ``(region, skeleton)`` in data-flow order. The last
region is the body (``pipe``); regions before it are layered into the body by
their skeleton (``place`` or ``transpose``).

Short names (``1f1b``, ``transpose``, ...) may carry options in call syntax,
e.g. ``transpose(owners=balanced, backward=central, order=interleaved)``.
A list form (from YAML/JSON) names each region's skeleton explicitly.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import List, Optional, Tuple, Union

from ..errors import SpecError, is_whole
from . import recompute as rc
from .orders import ORDER_NAMES
from .profile import ModelProfile


def default_order(V: int) -> str:
    """Body order when a schedule names none: ``1f1b``, or ``interleaved`` with V > 1 chunks per device."""
    return "1f1b" if V == 1 else "interleaved"


SKELETONS = ("pipe", "place", "transpose")
OWNERS = ("round_robin", "min", "balanced")
BACKWARDS = ("owner", "central")
SPILLS = ("none", "next_step")
OPTIMIZERS = ("replicated", "sharded")
SHORT_NAMES = ORDER_NAMES + ("transpose",)


@dataclass(frozen=True)
class Pipe:
    """Chunks of the region on devices ``c mod P``, ordered per device by ``order``.

    ``layers``: layers of every chunk in data-flow order (P x V of them), or None for the
    even split (see :mod:`.cut`).
    """

    order: str = "1f1b"
    skeleton: str = "pipe"
    layers: Optional[Tuple[int, ...]] = None
    recompute: rc.Spec = rc.NONE   # none, full, layers=K, or per-chunk counts (:mod:`.recompute`)


@dataclass(frozen=True)
class Place:
    """The whole region on one device, each task just before its consumer where possible."""

    device: int = 0
    skeleton: str = "place"
    recompute: rc.Spec = rc.NONE


@dataclass(frozen=True)
class Transpose:
    """Region replicated on every device; the owner of micro-batch m runs its forward in the prefix."""

    owners: str = "round_robin"
    backward: str = "owner"
    spill: str = "none"
    # replicated: every replica keeps the whole encoder's optimizer state; sharded: each pipeline device
    # keeps and updates 1/P of it from the all-reduced grads, then the updated parameters are gathered
    optimizer: str = "replicated"
    skeleton: str = "transpose"
    recompute: rc.Spec = rc.NONE


Skeleton = Union[Pipe, Place, Transpose]


@dataclass(frozen=True)
class Schedule:
    """Per-region skeletons in data-flow order; the last one is the pipelined body."""

    parts: Tuple[Tuple[str, Skeleton], ...]

    def __post_init__(self):
        # region -> skeleton, built once (a lookup per task must not copy the parts: quadratic in regions)
        object.__setattr__(self, "_by_region", dict(self.parts))

    @property
    def body(self) -> Tuple[str, Pipe]:
        return self.parts[-1]  # type: ignore[return-value]

    def skeleton(self, region: str) -> Skeleton:
        return self._by_region[region]

    def to_list(self) -> List[dict]:
        out = []
        for r, s in self.parts:
            d = dict(region=r, **asdict(s))
            if d.get("layers", 0) is None:
                del d["layers"]  # the even split
            elif "layers" in d:
                d["layers"] = list(d["layers"])
            if d["recompute"] == rc.NONE:
                del d["recompute"]   # the default: plans without recompute read as before
            elif isinstance(d["recompute"], tuple):
                d["recompute"] = list(d["recompute"])
            out.append(d)
        return out

    def name(self) -> str:
        """Compact name, e.g. ``transpose`` or ``transpose(order=interleaved)``."""
        body_order = self.body[1].order
        ups = [s for _, s in self.parts[:-1]]
        body_rc = self.body[1].recompute
        # a region's or a per-chunk recompute: only the list form says it
        short = not (any(rc.is_on(s.recompute) for s in ups) or isinstance(body_rc, tuple))
        if short and ups and all(isinstance(s, Transpose) for s in ups):
            t = ups[0]
            opts = [f"{k}={v}" for k, v, d in (("owners", t.owners, "round_robin"),
                                                ("backward", t.backward, "owner"),
                                                ("spill", t.spill, "none"),
                                                ("optimizer", t.optimizer, "replicated"),
                                                ("order", body_order, "1f1b"),
                                                ("recompute", body_rc, rc.NONE)) if v != d]
            return "transpose" + (f"({', '.join(opts)})" if opts else "")
        if short and all(isinstance(s, Place) and s.device == 0 for s in ups):
            return body_order + (f"(recompute={body_rc})" if body_rc != rc.NONE else "")
        return "; ".join(f"{r}:{s.skeleton}" + (f"(recompute={_rc_text(s.recompute)})" if rc.is_on(s.recompute)
                                                 else "") for r, s in self.parts)


def _rc_text(spec) -> str:
    return "[" + ", ".join(map(str, spec)) + "]" if isinstance(spec, tuple) else str(spec)


_CALL = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(?:\((.*)\))?\s*$")


def parse_call(text: str, field: str):
    """``name(k=v, ...)`` -> (name, {k: v}) (values as written)."""
    m = _CALL.match(text)
    if not m:
        raise SpecError(field, f"cannot parse {text!r}; write a short name ({', '.join(SHORT_NAMES)}) "
                               "optionally with options, e.g. transpose(backward=central)")
    name, args = m.group(1), m.group(2)
    opts = {}
    if args and args.strip():
        for item in args.split(","):
            if "=" not in item:
                raise SpecError(field, f"option {item.strip()!r} must be key=value")
            k, v = (s.strip() for s in item.split("=", 1))
            opts[k] = v
    return name, opts


def _choice(field: str, value, allowed) -> str:
    if value not in allowed:
        raise SpecError(field, f"{value!r} unknown; allowed: {', '.join(allowed)}")
    return value


def _transpose(field: str, given: dict, defaults: Optional[dict] = None, key: Optional[str] = None) -> Transpose:
    """The transpose skeleton of ``given`` options, ``defaults`` for the rest; with ``key`` (e.g.
    ``mpipe.encoder``) a default the spec also gives differently is refused naming that key."""
    for k, v in (defaults or {}).items():
        if key and k in given and str(given[k]) != str(v):
            raise SpecError(f"{key}.{k}", f"{v!r} contradicts {field} {k}={given[k]}; give it in one place")
    opts = dict(defaults or {}, **given)
    return Transpose(owners=_choice(f"{field}.owners", opts.get("owners", "round_robin"), OWNERS),
                     backward=_choice(f"{field}.backward", opts.get("backward", "owner"), BACKWARDS),
                     spill=_choice(f"{field}.spill", opts.get("spill", "none"), SPILLS),
                     optimizer=_choice(f"{field}.optimizer", opts.get("optimizer", "replicated"), OPTIMIZERS))


def _no_optimizer_option(field: str, opts: dict, skeleton: str) -> None:
    """``optimizer`` is a transpose option: refused, naming the field, on any other skeleton."""
    if "optimizer" in opts:
        raise SpecError(f"{field}.optimizer", f"{opts['optimizer']!r}: only the transpose skeleton has an "
                        f"optimizer option (it shards a replicated encoder's optimizer state); {skeleton} "
                        f"keeps each region on its own devices, nothing is replicated")


def _check_opts(field: str, opts: dict, allowed) -> None:
    for k in opts:
        if k not in allowed:
            raise SpecError(f"{field}.{k}", f"unknown option; allowed: {', '.join(allowed) or '(none)'}")


def expand_short(text: str, profile: ModelProfile, field: str = "schedule", V: int = 1,
                 transpose: Optional[dict] = None, transpose_key: Optional[str] = None) -> Schedule:
    """Expand a short name (with optional call options) to the list form for ``profile``.

    ``transpose`` without ``order`` pipes the body with :func:`default_order` (V chunks per device);
    options it does not give come from ``transpose`` (e.g. a recipe's ``mpipe.encoder``).
    """
    name, opts = parse_call(text, field)
    regions = profile.names()
    body, ups = regions[-1], regions[:-1]
    body_rc = rc.parse(f"{field}.recompute", opts.get("recompute", rc.NONE))
    if name in ORDER_NAMES:
        _no_optimizer_option(field, opts, name)
        _check_opts(field, opts, ("device", "recompute"))
        dev = opts.get("device", "0")
        if not str(dev).isdigit():
            raise SpecError(f"{field}.device", f"must be a device index, got {dev!r}")
        parts = [(r, Place(device=int(dev))) for r in ups] + [(body, Pipe(order=name, recompute=body_rc))]
        return Schedule(tuple(parts))
    if name == "transpose":
        _check_opts(field, opts, ("owners", "backward", "spill", "optimizer", "order", "recompute"))
        if not ups:
            raise SpecError(field, f"'transpose' needs an encoder region before the pipelined region; "
                                   f"the profile has only {body!r} (use one of: {', '.join(ORDER_NAMES)})")
        t = _transpose(field, {k: v for k, v in opts.items() if k != "recompute"}, transpose, transpose_key)
        order = _choice(f"{field}.order", opts.get("order", default_order(V)), ORDER_NAMES)
        return Schedule(tuple([(r, t) for r in ups] + [(body, Pipe(order=order, recompute=body_rc))]))
    raise SpecError(field, f"{name!r} unknown; allowed: {', '.join(SHORT_NAMES)}")


_ITEM_KEYS = {"pipe": ("region", "skeleton", "order", "layers", "recompute"),
              "place": ("region", "skeleton", "device", "recompute"),
              "transpose": ("region", "skeleton", "owners", "backward", "spill", "optimizer", "recompute")}


def _layers(field: str, value) -> Optional[Tuple[int, ...]]:
    """Explicit per-chunk layer counts of a pipe item: a list of whole numbers >= 1 (checked against P x V
    and the region's layers by :func:`.cut.cut`)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value or any(
            not is_whole(n) or n < 1 for n in value):
        raise SpecError(field, f"must be a list of whole numbers >= 1 (layers of every chunk), got {value!r}")
    return tuple(value)


def parse_list(items, profile: ModelProfile, field: str = "schedule", V: int = 1,
               transpose: Optional[dict] = None, transpose_key: Optional[str] = None) -> Schedule:
    """Parse the list form ``[{region, skeleton, ...}, ...]``; a ``pipe`` without order gets :func:`default_order`,
    a ``transpose`` item the options it does not give from ``transpose``."""
    if not isinstance(items, list) or not items:
        raise SpecError(field, "must be a short name or a non-empty list of {region, skeleton, ...}")
    parts = []
    for i, it in enumerate(items):
        w = f"{field}[{i}]"
        if not isinstance(it, dict):
            raise SpecError(w, "must be a mapping with region and skeleton")
        for k in ("region", "skeleton"):
            if k not in it:
                raise SpecError(f"{w}.{k}", "missing")
        region = it["region"]
        if region not in profile.names():
            raise SpecError(f"{w}.region", f"{region!r} unknown; allowed: {', '.join(profile.names())}")
        sk = _choice(f"{w}.skeleton", it["skeleton"], SKELETONS)
        if sk != "transpose":
            _no_optimizer_option(w, it, sk)
        _check_opts(w, {k: v for k, v in it.items()}, _ITEM_KEYS[sk])
        recompute = rc.parse(f"{w}.recompute", it.get("recompute", rc.NONE))
        if sk == "pipe":
            s = Pipe(order=_choice(f"{w}.order", it.get("order", default_order(V)), ORDER_NAMES),
                     layers=_layers(f"{w}.layers", it.get("layers")), recompute=recompute)
        elif sk == "place":
            dev = it.get("device", 0)
            if not is_whole(dev) or dev < 0:
                raise SpecError(f"{w}.device", f"must be a device index >= 0, got {dev!r}")
            s = Place(device=dev, recompute=recompute)
        else:
            s = replace(_transpose(w, {k: v for k, v in it.items() if k not in ("region", "skeleton", "recompute")},
                                   transpose, transpose_key), recompute=recompute)
        parts.append((region, s))
    names = [r for r, _ in parts]
    if names != list(profile.names()):
        raise SpecError(field, f"must name every region once in data-flow order: {', '.join(profile.names())}; "
                               f"got {', '.join(map(str, names))}")
    if not isinstance(parts[-1][1], Pipe) or any(isinstance(s, Pipe) for _, s in parts[:-1]):
        raise SpecError(f"{field}.skeleton", f"the last region ({names[-1]!r}) must use skeleton 'pipe' and the "
                                             "regions before it 'place' or 'transpose'")
    return Schedule(tuple(parts))


def parse_schedule(spec, profile: ModelProfile, field: str = "schedule", V: int = 1,
                   transpose: Optional[dict] = None, transpose_key: Optional[str] = None) -> Schedule:
    """A short name, a call-syntax string, a YAML/JSON list string, or a list of mappings.

    ``V`` (chunks per device) only picks the body order where the spec names none; ``transpose``:
    default options of transposed regions (the spec's own win; with ``transpose_key``, the key
    they come from, a spec that gives one differently is refused instead).
    """
    if isinstance(spec, Schedule):
        return spec
    if isinstance(spec, str) and spec.strip().startswith("["):
        import yaml
        try:
            spec = yaml.safe_load(spec)
        except yaml.YAMLError as e:
            raise SpecError(field, f"list form is not valid YAML: {str(e).splitlines()[0]}") from None
        except RecursionError:
            raise SpecError(field, "list form is nested too deep") from None
    if isinstance(spec, str):
        return expand_short(spec, profile, field, V, transpose, transpose_key)
    if isinstance(spec, list):
        return parse_list(spec, profile, field, V, transpose, transpose_key)
    raise SpecError(field, f"missing or invalid ({spec!r}); allowed short names: {', '.join(SHORT_NAMES)}, "
                           "or a list of {region, skeleton, ...}")
