"""Single-process reference: same model, data and seed, no pipeline.

The loss of a step is built from the micro-batch losses (of all data-parallel groups) with the
same loss scales as the pipeline (``train.loss_normalization``, :mod:`hyperparallel.data.loss_norm`:
the mean over the step's answer tokens, or of the micro-batch means); the micro-batches are read in
position order (``data.balance`` regroups a step's samples in the pipeline only: the same samples, so
with token normalization the same loss); the gradient comes from
``mindspore.value_and_grad`` (public API, independent of the runtime's tape autograd). With loss scaling
(``runner_wrapper.scale_sense``) the gradient is of the loss times the scale, unscaled before the norm, and a
step whose gradients overflow is skipped with the same scaler as the ranks (:mod:`.loss_scale`). The model
is the adapter's :meth:`~hyperparallel.models.base.ModelAdapter.reference` (e.g. mindone's whole
model called as users call it) or, by default, its chunks chained (:class:`ChunkChain`).
"""
from __future__ import annotations

from typing import Dict

import mindspore as ms

from hyperparallel.data.loss_norm import loss_scales
from hyperparallel.models.lora import trained
from hyperparallel.runconfig import RunConfig
from . import nonfinite
from .loss_scale import LossScale
from .optim import Optimizer, clip_scale, scaled, square_sum


class ChunkChain:
    """The whole model as one chunk per region (``build_full``), run in data-flow order. A reference
    model has ``cells`` (name -> Cell), ``params(region)`` and ``loss(micro_batch, loss_scale)``."""

    def __init__(self, model):
        self.model = model
        self.cells = dict(zip(model.region_names(), model.build_full()))

    def params(self, region: str) -> list:
        return list(self.cells[region].get_parameters())

    def loss(self, mb, loss_scale: float):
        mt = self.model.tensors(mb, loss_scale)
        x = self.model.model_input(mt)
        for cell in self.cells.values():
            x = cell.forward(x, mt)
        return x


class Reference:
    """Holds the full model and optimizer; ``step(s)`` runs one optimizer step."""

    def __init__(self, rc: RunConfig, num_micro: int, trainable: Dict[str, bool], total_steps: int = 0):
        self.rc, self.num_micro = rc, num_micro
        self.model, self.source = rc.model, rc.source()
        self.whole = self.model.reference() or ChunkChain(self.model)
        self.cells = list(self.whole.cells.values())   # the model's Cells (load a checkpoint into these)
        self.params = [p for r in self.model.region_names() if trainable.get(r, True) for p in self.whole.params(r)]
        self.opt = Optimizer(self.params, rc.train, total_steps or rc.train.steps)
        self.grad_norm, self.lr = 0.0, 0.0   # of the last step
        self.skipped, self.steps_skipped = False, 0   # the last step had no update; steps so (train.nonfinite)
        self.scaler = LossScale(getattr(rc.train, "loss_scale", None))
        self.overflow, self.loss_scale = False, 1.0   # the last step's overflow verdict and loss scale

    def all_params(self) -> list:
        """Every parameter of the model a checkpoint holds (trained or in a frozen region; not the base weights
        LoRA froze), e.g. to save it as one checkpoint file."""
        return [p for cell in self.cells for p in trained(cell.get_parameters())]

    def restore(self, src):
        """Load checkpoint ``src`` (:class:`~.ckpt_files.Source`: a step directory, a merged file or a Hugging
        Face directory) by global name into the model and the optimizer, the data at its saved position, as a
        pipeline rank restores its chunks. Returns (step to continue from, optimizer state loaded);
        CheckpointError if it does not fit."""
        from .checkpoint import restore_with_data
        from .comm import LocalComm
        chunks = {str(i): cell for i, cell in enumerate(self.cells)}
        out = restore_with_data(src, LocalComm(), chunks, self.opt, self.source, self.model.checkpoint_name)
        self.scaler.load((src.meta or {}).get("loss_scale") or {})
        return out

    def step(self, step: int):
        """Returns (loss, {param name: grad}) of this step, after applying the update; a non-finite loss or
        grad norm raises :class:`~.nonfinite.NonFiniteStep` before it (``train.nonfinite: stop``) or skips it
        (``skip``: ``self.skipped``)."""
        mbs = [self.source.micro_batch(step, m) for m in range(self.num_micro)]
        scales = loss_scales(self.source, step, self.num_micro, self.rc.train.loss_normalization)

        seed = self.loss_scale = self.scaler.value

        def total(_):
            loss = 0.0
            for mb, scale in zip(mbs, scales):
                loss = loss + self.whole.loss(mb, scale)
            return loss if seed == 1.0 else loss * seed   # the gradient is of the scaled loss
        loss, grads = ms.value_and_grad(total, None, weights=self.params)(ms.Tensor(0.0))
        named = scaled({p.name: g for p, g in zip(self.params, grads)}, 1.0 / seed)
        self.grad_norm = square_sum(list(named.values()), compiled=self.rc.train.optimizer_compile != "eager") ** 0.5
        self.lr = self.opt.lr(step)
        value = float(loss.asnumpy()) / seed
        bad = nonfinite.verdict(value, self.grad_norm)   # before the update, as the pipeline decides it
        self.skipped = bool(bad)
        self.overflow = bool(bad) and self.scaler.on and nonfinite.finite(value)
        if bad and not self.overflow and self.rc.train.nonfinite != "skip":
            raise nonfinite.NonFiniteStep(step, bad)
        if bad:
            self.steps_skipped += 1
            if self.overflow:
                self.scaler.update(False)
        else:
            self.opt.step(scaled(named, clip_scale(self.grad_norm, self.rc.train.max_grad_norm)))
            self.scaler.update(True)
        return value, {k: v.asnumpy() for k, v in named.items()}
