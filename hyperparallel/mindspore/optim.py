"""Optimizer shared by the pipeline ranks and the reference (same update rule)."""
from __future__ import annotations

from typing import Dict, List

from mindspore import nn, Parameter, Tensor

from .config import TrainConfig


class Optimizer:
    """Wraps ``nn.Adam``/``nn.SGD`` over a fixed list of parameters, applied to a grads dict."""

    def __init__(self, params: List[Parameter], cfg: TrainConfig):
        self.params = list(params)
        if not self.params:
            self.opt = None
        elif cfg.optimizer == "adam":
            self.opt = nn.Adam(self.params, learning_rate=cfg.lr)
        else:
            self.opt = nn.SGD(self.params, learning_rate=cfg.lr, momentum=0.9)

    def step(self, grads: Dict[str, Tensor]) -> None:
        if self.opt is not None:
            self.opt(tuple(grads[p.name] for p in self.params))

    def state(self) -> Dict[str, Parameter]:
        """Optimizer state (moments, step counters) by name, for checkpoints."""
        if self.opt is None:
            return {}
        names = {p.name for p in self.params}
        return {p.name: p for p in self.opt.get_parameters() if p.name not in names}
