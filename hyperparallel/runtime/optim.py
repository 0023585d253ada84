"""The optimizer every pipeline rank and the reference build from the same settings (same update rule).

MindFormers' sections (``optimizer``, ``lr_schedule``) are built with MindFormers' own ``build_optim`` /
``build_lr`` and its weight-decay grouping (``get_optimizer_grouped_parameters``: no decay for 1-D
parameters and biases), exactly as MindFormers' trainer does; the ``train:`` section builds ``nn.Adam`` /
``nn.SGD`` at a constant rate. Gradient clipping is MindFormers' ``ClipGradNorm`` rule over the *global*
norm: gradients are scaled by ``max_norm / max(norm, max_norm)``; in a pipeline the norm's square is a sum
over every rank's parameters, each counted once (:func:`counted_params`).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor, nn, ops
import mindspore as ms

from hyperparallel.recipe.train import TrainConfig

# Optimizer Parameters that are recipe values, not state: saved (as MindSpore does) but never restored.
HYPER_PARAMS = ("learning_rate", "momentum")


class _Params(nn.Cell):
    """A parameter list as the ``Cell`` MindFormers' grouping function reads (``trainable_params()``)."""

    def __init__(self, params: List[Parameter]):
        super().__init__()
        self._plist = list(params)

    def trainable_params(self, recurse=True):
        return list(self._plist)


def decay_groups(params: List[Parameter], cfg: TrainConfig) -> List[Tuple[Optional[float], List[Parameter]]]:
    """The run's weight-decay groups of ``params``, as its optimizer groups them: (weight decay, parameters)
    per group, MindFormers' grouping (``get_optimizer_grouped_parameters``: no decay for 1-D parameters and
    biases) for its sections; for the ``train:`` section one group (None: the optimizer's own setting)."""
    if not cfg.opt.grouped:
        return [(None, list(params))]
    from mindformers.trainer.optimizer_grouped_parameters import get_optimizer_grouped_parameters
    groups = get_optimizer_grouped_parameters(_Params(params), weight_decay=cfg.opt.get("weight_decay", 0.0),
                                              optimizer_type=cfg.opt.type)
    return [(float(g["weight_decay"]), list(g["params"])) for g in groups]


def _build(params: List[Parameter], cfg: TrainConfig, total_steps: int, decays: Optional[Sequence] = None):
    """(MindSpore optimizer, learning-rate schedule Cell or None) for ``params``; ``decays``: each parameter's
    weight decay, given (a sharded optimizer's flat shares, one per weight-decay group of the model's
    parameters: :mod:`.sharded`), else MindFormers' grouping of ``params`` themselves."""
    sched = cfg.schedule
    if not cfg.opt.grouped:   # train: section
        cls = {"Adam": nn.Adam, "SGD": nn.SGD}[cfg.opt.type]
        return cls(params, learning_rate=sched.learning_rate, **dict(cfg.opt.kwargs)), None
    from mindformers.core.lr import build_lr
    from mindformers.core.optim import build_optim
    lr = build_lr(dict(type=sched.type, **sched.fields_for(total_steps))) if sched.type else sched.learning_rate
    if decays is not None:
        groups = [{"weight_decay": float(wd), "params": [p]} for p, wd in zip(params, decays)]
    else:
        groups = [{"weight_decay": wd, "params": ps} for wd, ps in decay_groups(params, cfg)]
    kw = {k: v for k, v in cfg.opt.kwargs if k != "weight_decay"}
    if cfg.opt.type == "AdamW":
        kw["weight_decay"] = cfg.opt.get("weight_decay", 0.0)
    opt = build_optim(dict(type=cfg.opt.type, **kw), default_args={"params": groups, "learning_rate": lr})
    return opt, (lr if sched.type else None)


class Optimizer:
    """The run's optimizer over a fixed list of parameters, applied to a grads dict."""

    def __init__(self, params: List[Parameter], cfg: TrainConfig, total_steps: int = 0,
                 decays: Optional[Sequence] = None):
        self.params = list(params)
        self.cfg = cfg
        self.opt, self.schedule = (None, None) if not self.params else _build(self.params, cfg, total_steps or cfg.steps,
                                                                              decays)
        # the order MindSpore's optimizer takes gradients in (its parameter groups' order)
        self._order = [p.name for p in self.opt.parameters] if self.opt is not None else []

    def step(self, grads: Dict[str, Tensor]) -> None:
        if self.opt is not None:
            self._update(tuple(grads[n] for n in self._order))

    def _update(self, grads: tuple) -> None:
        """The optimizer Cell's update: as MindSpore runs it (``nn.Adam``/``nn.SGD``: a ``@jit`` graph,
        compiled on the first call), or with ``train.optimizer_compile: eager`` the same ``construct``
        run op by op (the function ``@jit`` wraps; what MindSpore's ``MS_JIT=0`` does, for this Cell only)."""
        if getattr(self.cfg, "optimizer_compile", "jit") == "eager":
            from .compat import run_op_by_op
            if run_op_by_op(self.opt, grads):
                return
        self.opt(grads)

    def lr(self, step: int) -> float:
        """The learning rate of the next update (of step ``step``, 0-based): the schedule at the optimizer's
        own ``global_step``, the updates it applied (MindSpore's optimizer reads its schedule there; a step
        skipped for a non-finite loss, ``train.nonfinite: skip``, does not advance it), else at ``step``."""
        if self.schedule is None:
            return float(self.cfg.schedule.learning_rate)
        gs = getattr(self.opt, "global_step", None)
        at = int(gs.asnumpy().reshape(-1)[0]) if gs is not None else int(step)
        return float(self.schedule(Tensor(at, ms.int32)).asnumpy())

    def state(self) -> Dict[str, Parameter]:
        """Optimizer state by MindSpore's own names (what checkpointing a single-process
        ``TrainOneStepCell`` writes): ``moment1.<param>``, ``moment2.<param>``, ``beta1_power``,
        ``beta2_power``, ``global_step``, ``learning_rate`` (Adam); ``adam_m.<param>``, ``adam_v.<param>``
        (MindFormers' AdamW); ``accum.<param>``, ``stat.<param>``, ``momentum``, ... (SGD)."""
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


def _square_sum(*grads):
    """The float32 square sum, the same Python for the graph and for op by op."""
    total = 0.0
    for g in grads:
        total = total + ops.sum(ops.square(g.astype(ms.float32)))
    return total


_square_sum_graph = ms.jit(_square_sum)   # one graph per rank (its gradients' shapes never change)


def square_sum(grads: Sequence[Tensor], compiled: bool = True) -> float:
    """Sum of the squares of every element of ``grads`` (float32, as MindFormers' ``get_square_sum``).
    ``compiled``: in one MindSpore graph, as MindFormers computes it inside its train-step graph
    (``train.optimizer_compile: jit``, the default: one launch a step instead of three ops per
    gradient), else the same sum op by op (bit-identical: the same adds in the same order)."""
    if not grads:
        return 0.0
    return float((_square_sum_graph if compiled else _square_sum)(*grads).asnumpy())


def clip_scale(norm: float, max_norm) -> float:
    """MindFormers' ``ClipGradNorm``: gradients times ``max_norm / max(norm, max_norm)`` (1: no clipping)."""
    if not max_norm or not math.isfinite(norm):
        return 1.0
    return float(max_norm) / max(norm, float(max_norm))


def scaled(grads: Dict[str, Tensor], scale: float) -> Dict[str, Tensor]:
    """The gradients times ``scale`` (out of place: in-place ops do nothing on CPU)."""
    if scale == 1.0:
        return grads
    s = Tensor(scale, ms.float32)
    return {k: (g * s.astype(g.dtype)) for k, g in grads.items()}
