"""The micro-batches data sources yield: shape facts and text arrays now, pixels on demand.

:class:`MicroBatch` is the ``merge_index`` layout (:mod:`.formats`; a model family's own layout keeps its
micro-batch class in its folder, e.g. ``hyperparallel/models/qwen_vl/batch.py``).

``images_per_sample`` (plus ``extra_images``, a filler image added when no sample of
the micro-batch has one) is all a rank needs to size the encoder's messages; the
pixels (``patches``) are produced by ``load()`` on first access, so a rank that never
runs the encoder's first chunk never decodes an image.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np


class PatchGeometry:
    """Patch sizes of a data config with ``image_size``, ``patch`` and ``channels`` (images are
    square, cut into non-overlapping ``patch x patch`` squares)."""

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch * self.patch


class MicroBatch:
    """One micro-batch as numpy arrays.

    * ``patches``: (num_images, num_patches, patch_dim) float32, loaded lazily;
    * ``text_ids``: (total text tokens,) int32;
    * ``merge_index``: (B * seq_len,) int32 into the table [zero row | image tokens | text tokens];
    * ``onehot``: (B, seq_len, vocab) float32 next-token targets; ``mask``: (B, seq_len) float32,
      1 where a target counts;
    * ``images_per_sample``: images of each sample; ``extra_images``: filler images after them
      (never referenced by ``merge_index``).
    """

    def __init__(self, text_ids: np.ndarray, merge_index: np.ndarray, onehot: np.ndarray, mask: np.ndarray,
                 images_per_sample: List[int], patches: Optional[np.ndarray] = None,
                 load: Optional[Callable[[], np.ndarray]] = None, extra_images: int = 0,
                 sample_ids: Optional[List[str]] = None):
        if patches is None and load is None:
            raise ValueError("MicroBatch needs patches or a load() for them")
        self.text_ids, self.merge_index, self.onehot, self.mask = text_ids, merge_index, onehot, mask
        self.images_per_sample = [int(n) for n in images_per_sample]
        self.extra_images = int(extra_images)
        self.sample_ids = sample_ids
        self._patches, self._load = patches, load

    @property
    def loss_tokens(self) -> int:
        """Positions the loss is a mean over (``mask`` ones)."""
        return int(np.count_nonzero(self.mask))

    @property
    def num_images(self) -> int:
        """Images the encoder sees (a shape fact: known without loading pixels)."""
        return sum(self.images_per_sample) + self.extra_images

    @property
    def pixels_loaded(self) -> bool:
        return self._patches is not None

    @property
    def patches(self) -> np.ndarray:
        if self._patches is None:
            p = self._load()
            if p.shape[0] != self.num_images:
                raise RuntimeError(f"data: loaded {p.shape[0]} images for a micro-batch of {self.num_images}")
            self._patches, self._load = p, None
        return self._patches


def patchify(img: np.ndarray, p: int) -> np.ndarray:
    """(C, H, W) image -> (H/p * W/p, C*p*p) patches, row-major over the patch grid."""
    c, h, w = img.shape
    x = img.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)
    return x.reshape((h // p) * (w // p), c * p * p)

