"""Optimizer shared by the pipeline ranks and the reference (same update rule)."""
from __future__ import annotations

from typing import Dict, List, Tuple

from mindspore import nn, Parameter, Tensor

from hyperparallel.recipe.train import TrainConfig

# Optimizer Parameters that are recipe values, not state: saved (as MindSpore does) but never restored.
HYPER_PARAMS = ("learning_rate", "momentum")


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
        """Optimizer state by MindSpore's own names (what checkpointing a single-process
        ``TrainOneStepCell`` writes): ``moment1.<param>``, ``moment2.<param>``, ``beta1_power``,
        ``beta2_power``, ``global_step``, ``learning_rate`` (Adam); ``accum.<param>``,
        ``stat.<param>``, ``momentum``, ... (SGD)."""
        if self.opt is None:
            return {}
        names = {p.name for p in self.params}
        return {p.name: p for p in self.opt.get_parameters() if p.name not in names}

    def state_groups(self) -> Tuple[Dict[str, List[str]], List[str]]:
        """({param name: its state names}, global state names), split by MindSpore's
        ``<slot>.<param name>`` naming."""
        names = {p.name for p in self.params}
        per: Dict[str, List[str]] = {}
        glob: List[str] = []
        for n in self.state():
            _, _, owner = n.partition(".")
            if owner in names:
                per.setdefault(owner, []).append(n)
            else:
                glob.append(n)
        return per, glob
