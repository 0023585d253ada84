"""Bad input, refused: one error type for bad user input (recipe, schedule spec, CLI, plan files), the
plan checker's error, and the few checks every layer shares (one message per rule). The bottom layer."""
import math
from typing import Optional


class SpecError(ValueError):
    """A refused input. The message is one line naming the field and the allowed values."""

    MAX_CHARS = 2000   # a value quoted in the message (e.g. a YAML alias bomb) is cut here

    def __init__(self, field: str, message: str):
        self.field = field
        message = " ".join(str(message).splitlines())
        if len(message) > self.MAX_CHARS:
            message = message[: self.MAX_CHARS] + f"... ({len(message):,} characters)"
        super().__init__(f"{field}: {message}")


class PlanError(ValueError):
    """A derived or loaded plan that breaks a rule (checker finding)."""


def is_whole(value) -> bool:
    """An ``int`` that is not a ``bool`` (YAML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def whole(field: str, value, minimum: int = 1, maximum: Optional[int] = None, shown=repr) -> int:
    """``value`` if it is a whole number ``minimum``.. (``..maximum``), else the refusal naming ``field``;
    ``shown`` writes the value into the message."""
    if not is_whole(value) or value < minimum:
        raise SpecError(field, f"must be a whole number >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise SpecError(field, f"must be a whole number {minimum}..{maximum:,}, got {shown(value)}")
    return value


def is_number(value) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(field: str, value, least: float = 0.0, strict: bool = False) -> float:
    """``value`` as a float if it is a finite number ``> least`` (``strict``) or ``>= least``, else the
    refusal naming ``field`` (a NaN or an infinity: "must be a finite number")."""
    bound = f"{'>' if strict else '>='} {least:g}"
    if is_number(value) and not math.isfinite(value):
        raise SpecError(field, f"must be a finite number {bound}, got {value!r}")
    if not is_number(value) or (value <= least if strict else value < least):
        raise SpecError(field, f"must be a number {bound}, got {value!r}")
    return float(value)


def nearest(key: str, known) -> str:
    """The known key closest to a misspelt one ('' when none is close): ``pipline_stage`` -> ``pipeline_stage``."""
    import difflib
    found = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.6)
    return found[0] if found else ""


def unknown_key(prefix: str, given, known, what: str = "") -> SpecError:
    """The refusal of the first unknown key of ``given`` (sorted) under ``prefix`` (``parallel_config``;
    empty for top-level keys): names it, the known keys, and the nearest one (``did you mean``)."""
    known = list(dict.fromkeys(str(k) for k in known))
    bad = sorted(str(k) for k in set(map(str, given)) - set(known))[0]
    near = nearest(bad, known)
    listed = ", ".join(known) if len(known) <= 24 else f"{len(known)} keys, listed in docs/mindformers.md ('Recipe keys')"
    hint = f"; did you mean {near!r}?" if near else ""
    return SpecError(f"{prefix}.{bad}" if prefix else bad,
                     f"unknown key{' ' + what if what else ''}; allowed: {listed}{hint}")
