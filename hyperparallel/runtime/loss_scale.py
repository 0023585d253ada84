"""Loss scaling (``runner_wrapper.scale_sense``) for float16 compute: MindSpore's own scalers, one per rank.

The scale is the seed of the backward on the last stage (the interpreter's ``loss_seed``: the micro-batch
losses themselves stay unscaled), so every gradient, those crossing ranks included, is the scale times the
true one; every rank divides its gradients by the scale before clipping and the update. Overflow (the
step's all-reduced gradient norm not finite while its loss is) is therefore one verdict on every rank: the
update is skipped everywhere and a dynamic scale goes down (``mindspore.amp.DynamicLossScaler.adjust``:
divided by ``scale_factor``, not below 1; multiplied by it after ``scale_window`` finite steps in a row, as
MindSpore's ``DynamicLossScaleUpdateCell`` and MindFormers' trainer do). A static scale
(``FixedLossScaleUpdateCell`` or a number) never changes; its overflowing steps are skipped too (MindSpore's
``TrainOneStepWithLossScaleCell`` skips the optimizer on overflow with either cell).
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore.amp import DynamicLossScaler

from hyperparallel.recipe.train import LossScaleSpec


class LossScale:
    """The run's loss scale: ``value`` (1.0 without loss scaling), ``update(finite)`` after each step."""

    def __init__(self, spec: Optional[LossScaleSpec]):
        self.spec = spec
        self._value = float(spec.value) if spec is not None else 1.0
        self._dynamic = (DynamicLossScaler(spec.value, spec.factor, spec.window)
                         if spec is not None and spec.kind == "dynamic" else None)

    @property
    def on(self) -> bool:
        return self.spec is not None

    @property
    def value(self) -> float:
        if self._dynamic is not None:
            return float(self._dynamic.scale_value.asnumpy())
        return self._value

    def update(self, finite: bool) -> None:
        """After a step: its gradients were finite (applied) or overflowed (skipped)."""
        if self._dynamic is not None:
            self._dynamic.adjust(ms.Tensor(bool(finite)))

    def state(self) -> dict:
        """{name: value} for a checkpoint (MindFormers' ``loss_scale`` and the dynamic scaler's counter)."""
        out = {"loss_scale": self.value}
        if self._dynamic is not None:
            out["loss_scale_counter"] = int(self._dynamic.counter.asnumpy())
        return out

    def load(self, values: dict) -> None:
        """The state of :meth:`state` (a checkpoint's); missing names keep the recipe's initial scale."""
        if self._dynamic is None:
            return
        from mindspore import ops
        if "loss_scale" in values:
            ops.assign(self._dynamic.scale_value, ms.Tensor(float(values["loss_scale"]), ms.float32))
        if "loss_scale_counter" in values:
            ops.assign(self._dynamic.counter, ms.Tensor(int(values["loss_scale_counter"]), ms.int32))
