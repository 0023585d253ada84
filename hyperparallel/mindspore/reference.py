"""Single-process reference: same model, data and seed, no pipeline.

The loss of a step is the mean over all micro-batches (of all data-parallel
groups) of the per-micro-batch loss, exactly what the pipeline computes; the
gradient comes from ``mindspore.value_and_grad`` (public API, independent of
the runtime's tape autograd).
"""
from __future__ import annotations

from typing import Dict

import mindspore as ms

from hyperparallel.runconfig import RunConfig
from .optim import Optimizer


class Reference:
    """Holds the full model and optimizer; ``step(s)`` runs one optimizer step."""

    def __init__(self, rc: RunConfig, num_micro: int, trainable: Dict[str, bool]):
        self.rc, self.num_micro = rc, num_micro
        self.model, self.source = rc.model, rc.source()
        self.cells = self.model.build_full()   # one chunk per region, in data-flow order
        self.params = []
        for region, cell in zip(self.model.region_names(), self.cells):
            if trainable.get(region, True):
                self.params += list(cell.get_parameters())
        self.opt = Optimizer(self.params, rc.train)

    def all_params(self):
        return [p for cell in self.cells for p in cell.get_parameters()]

    def step(self, step: int):
        """Returns (loss, {param name: grad}) of this step, after applying the update."""
        mts = [self.model.tensors(self.source.micro_batch(step, m), 1.0 / self.num_micro)
               for m in range(self.num_micro)]

        def total(_):
            loss = 0.0
            for mt in mts:
                x = self.model.model_input(mt)
                for cell in self.cells:
                    x = cell.forward(x, mt)
                loss = loss + x
            return loss
        loss, grads = ms.value_and_grad(total, None, weights=self.params)(ms.Tensor(0.0))
        named = {p.name: g for p, g in zip(self.params, grads)}
        self.opt.step(named)
        return float(loss.asnumpy()), {k: v.asnumpy() for k, v in named.items()}
