"""Run configuration from the recipe's ``model:``, ``data:``, ``train:`` sections.

Pure Python (no MindSpore): the launcher validates these before starting msrun.
Errors are ValueErrors whose message starts with the offending field.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from .data import DataConfig

VISION = "vision"
LLM = "llm"
# MindFormers' own keys under ``model:`` (read by the recipe loader, not by the tiny model)
MINDFORMERS_MODEL_KEYS = ("model_config", "arch")


def _take(cls, section: str, sec: Optional[dict], extra_ok=()):
    sec = dict(sec or {})
    if not isinstance(sec, dict):
        raise ValueError(f"{section}: must be a mapping")
    known = {f.name for f in fields(cls)} - set(extra_ok)
    bad = sorted(set(sec) - known)
    if bad:
        raise ValueError(f"{section}.{bad[0]}: unknown key (known: {', '.join(sorted(known))})")
    return sec


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny MLLM; layer counts come from the profile, shapes from the data."""

    vision_layers: int = 2
    llm_layers: int = 4
    vision_dim: int = 32
    vision_heads: int = 2
    llm_dim: int = 32
    llm_heads: int = 2
    mlp_ratio: int = 2
    vocab: int = 32
    patch_dim: int = 48
    num_patches: int = 4
    seq_len: int = 24
    init_std: float = 0.02


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
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    device: str = "CPU"

    @staticmethod
    def from_raw(raw: dict, layers: Optional[dict] = None) -> "RunConfig":
        """``layers``: {region: layer count} from the parsed profile or the plan's chunks
        (default: the raw ``mpipe.profile.regions``)."""
        data = DataConfig.from_section(raw.get("data"))
        msec = _take(ModelConfig, "model", {k: v for k, v in (raw.get("model") or {}).items()
                                            if k not in MINDFORMERS_MODEL_KEYS},
                     extra_ok=("vision_layers", "llm_layers", "vocab", "patch_dim", "num_patches", "seq_len"))
        if layers is None:
            regions = (((raw.get("mpipe") or {}).get("profile") or {}).get("regions")) or []
            layers = {r.get("name"): r.get("layers") for r in regions if isinstance(r, dict)}
        for name in (VISION, LLM):
            if name not in layers:
                raise ValueError(f"mpipe.profile.regions: the tiny MLLM needs a region named {name!r}")
        model = ModelConfig(vision_layers=int(layers[VISION]), llm_layers=int(layers[LLM]),
                            **data.shapes(), **msec)
        for dim, heads in (("vision_dim", "vision_heads"), ("llm_dim", "llm_heads")):
            if getattr(model, dim) % getattr(model, heads):
                raise ValueError(f"model.{heads}: must divide model.{dim}")
        tsec = _take(TrainConfig, "train", raw.get("train"))
        train = TrainConfig(**tsec)
        if train.optimizer not in ("adam", "sgd"):
            raise ValueError(f"train.optimizer: {train.optimizer!r} unknown (adam, sgd)")
        if train.steps < 1:
            raise ValueError("train.steps: must be >= 1")
        device = raw.get("device", "CPU")
        if device not in ("CPU", "Ascend"):
            raise ValueError(f"device: {device!r} unknown (CPU, Ascend)")
        return RunConfig(model=model, data=data, train=train, device=device)


def run_config_of(recipe) -> RunConfig:
    """The run config of a loaded recipe, checked before launch: a bad value is a one-line SpecError."""
    from hyperparallel.mpipe.errors import SpecError

    try:
        return RunConfig.from_raw(recipe.raw, {r.name: r.layers for r in recipe.profile.regions})
    except (TypeError, ValueError) as e:
        msg = str(e).splitlines()[0]
        field, _, rest = msg.partition(": ")
        raise SpecError(field, rest or msg) from None
