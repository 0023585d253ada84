"""The recipe's ``train:`` section: optimizer and loop settings (pure Python)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from ..mpipe.errors import SpecError

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and loop knobs (recipe ``train:`` section)."""

    seed: int = 0
    steps: int = 20
    lr: float = 0.01
    optimizer: str = "adam"       # adam | sgd
    save_every: int = 0           # checkpoint every N steps with --save-dir (0: only at the end)

    @staticmethod
    def from_section(sec: Optional[dict]) -> "TrainConfig":
        sec = dict(sec or {})
        known = [f.name for f in fields(TrainConfig)]
        bad = sorted(set(sec) - set(known))
        if bad:
            raise SpecError(f"train.{bad[0]}", f"unknown key (known: {', '.join(sorted(known))})")
        cfg = TrainConfig(**sec)
        if cfg.optimizer not in OPTIMIZERS:
            raise SpecError("train.optimizer", f"{cfg.optimizer!r} unknown ({', '.join(OPTIMIZERS)})")
        for key, least in (("seed", 0), ("steps", 1), ("save_every", 0)):
            v = getattr(cfg, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise SpecError(f"train.{key}", f"must be a whole number >= {least}, got {v!r}")
        if isinstance(cfg.lr, bool) or not isinstance(cfg.lr, (int, float)) or not cfg.lr > 0:
            raise SpecError("train.lr", f"must be a number > 0, got {cfg.lr!r}")
        return cfg
