"""Data on the MindSpore side: micro-batches as tensors.

The sources themselves live in :mod:`hyperparallel.data` (pure numpy, plus
``mindspore.dataset`` for image decoding); the names below are re-exported for the
code that imported them from here.
"""
from __future__ import annotations

from hyperparallel.data import (DataConfig, MicroBatch, SyntheticSource, data_source,  # noqa: F401
                                make_micro_batch)


class MicroTensors:
    """A MicroBatch as MindSpore tensors, plus the loss scale (1 / total micro-batches).

    ``patches`` (the pixels) becomes a tensor, and is loaded, only when first read: the
    model's input chunk reads it; other chunks need the text side inputs only."""

    def __init__(self, mb: MicroBatch, loss_scale: float):
        from mindspore import Tensor
        self.batch = mb
        self._patches = None
        self.text_ids = Tensor(mb.text_ids)
        self.merge_index = Tensor(mb.merge_index)
        self.onehot = Tensor(mb.onehot)
        self.mask = Tensor(mb.mask)
        self.loss_scale = float(loss_scale)

    @property
    def patches(self):
        if self._patches is None:
            from mindspore import Tensor
            self._patches = Tensor(self.batch.patches)
        return self._patches
