"""Run configuration from the recipe's ``model:``, ``data:``, ``train:`` sections.

Pure Python (no MindSpore): the launcher validates these before starting msrun.
Errors are ValueErrors whose message starts with the offending field. The model
is an adapter (:mod:`hyperparallel.models`): it owns the region names and depths;
the recipe's cost profile, where it gives layer counts, must agree with them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

from hyperparallel.models import ModelAdapter, adapter_for

from hyperparallel.data import data_config


def _take(cls, section: str, sec: Optional[dict]):
    sec = dict(sec or {})
    known = {f.name for f in fields(cls)}
    bad = sorted(set(sec) - known)
    if bad:
        raise ValueError(f"{section}.{bad[0]}: unknown key (known: {', '.join(sorted(known))})")
    return sec


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and loop knobs (recipe ``train:`` section)."""

    seed: int = 0
    steps: int = 20
    lr: float = 0.01
    optimizer: str = "adam"       # adam | sgd
    save_every: int = 0           # checkpoint every N steps with --save-dir (0: only at the end)


@dataclass(frozen=True)
class RunConfig:
    model: ModelAdapter
    data: object   # DataConfig (synthetic) or ConversationsConfig
    train: TrainConfig
    device: str = "CPU"

    @staticmethod
    def from_raw(raw: dict) -> "RunConfig":
        data = data_config(raw)
        tsec = _take(TrainConfig, "train", raw.get("train"))
        train = TrainConfig(**tsec)
        if train.optimizer not in ("adam", "sgd"):
            raise ValueError(f"train.optimizer: {train.optimizer!r} unknown (adam, sgd)")
        if train.steps < 1:
            raise ValueError("train.steps: must be >= 1")
        device = raw.get("device", "CPU")
        if device not in ("CPU", "Ascend"):
            raise ValueError(f"device: {device!r} unknown (CPU, Ascend)")
        model = adapter_for(raw.get("model"), data.shapes(), train.seed)
        model.check_device(device)
        return RunConfig(model=model, data=data, train=train, device=device)


def check_regions(model: ModelAdapter, regions: Sequence, where: str = "mpipe.profile.regions") -> None:
    """The profile's (or plan's) regions must be the model's, in order, with the model's depths.

    ``regions``: objects with ``name`` and ``layers`` (profile regions). ValueError names both keys."""
    names = [r.name for r in regions]
    want = model.regions()
    if names != [r.name for r in want]:
        raise ValueError(f"{where}: regions {names} but the {model.family} model has "
                         f"{[r.name for r in want]} (in data-flow order)")
    for i, (got, w) in enumerate(zip(regions, want)):
        if got.layers is not None and int(got.layers) != w.layers:
            raise ValueError(f"{where}[{i}].layers: {got.layers} but {w.key or 'the model'} is {w.layers} "
                             f"(the model owns its depth; the profile gives costs only)")


def run_config_of(recipe) -> RunConfig:
    """The run config of a loaded recipe, checked before launch: a bad value is a one-line SpecError."""
    from hyperparallel.mpipe.errors import SpecError

    try:
        rc = RunConfig.from_raw(recipe.raw)
        check_regions(rc.model, recipe.profile.regions)
        return rc
    except (TypeError, ValueError) as e:
        msg = str(e).splitlines()[0]
        field, _, rest = msg.partition(": ")
        raise SpecError(field, rest or msg) from None
