"""The ``qwen_vl`` source: conversations as Qwen's processor lays them out (:class:`~.batch.QwenVLBatch`).

Token ids, labels and image grids come from the index (grids from the image headers); the pixels
are transformers' ``Qwen2VLImageProcessor`` output, computed in the :class:`~hyperparallel.data.pixels.PixelStream`
read-ahead pipeline or eagerly with the same callable, on the first read of ``pixel_values``.
An image whose decoded grid is not its header's stops the run (RuntimeError naming the file;
``data check`` reports it as ``grid_mismatch``). Videos (:mod:`.video`) are decoded on the first read of
``pixel_values_videos``, eagerly (PyAV for a file, Pillow for a frame list), and checked the same way.
"""
from __future__ import annotations

from typing import List

import numpy as np

from .batch import QwenVLBatch
from ...data.conversations import layout_for
from ...data.conversations_config import ConversationsConfig
from ...data.indexed import IndexedSource
from .layout import QwenLayout

IGNORE = -100


class QwenVLSource(IndexedSource):
    """``micro_batch(step, micro)`` -> :class:`~.batch.QwenVLBatch`; ``data_format``: a qwen_vl format."""

    def __init__(self, cfg: ConversationsConfig, data_format, seed: int):
        layout = layout_for(cfg, data_format)
        if not isinstance(layout, QwenLayout):
            raise TypeError("QwenVLSource lays out qwen_vl micro-batches; merge_index: ConversationsSource")
        super().__init__(cfg, layout, seed)
        self.fmt, self.special = layout.fmt, layout.special
        self.filler_patches = int(np.prod(self.filler_grid))
        from ...data.pixels import PixelStream
        self.pixels = PixelStream(self.files_of, lambda: [layout.pixels()], cfg.num_parallel_workers, cfg.prefetch,
                                  outputs=("pixel_values", "grid"))

    @property
    def filler_grid(self) -> tuple:
        return 1, self.fmt.merge_size, self.fmt.merge_size

    @property
    def patch_dim(self) -> int:
        f = self.fmt
        return self.cfg.channels * f.temporal_patch_size * f.patch_size * f.patch_size

    def sample_patches(self, s) -> int:
        """Patches of every image at its own resolution and of every video (t*h*w of their grids, from the
        headers)."""
        return int(sum(int(np.prod(g)) for g in s.enc.grids) + sum(int(np.prod(v.grid)) for v in s.enc.videos))

    def micro_batch(self, step: int, micro: int) -> QwenVLBatch:
        key = (int(step), int(micro))
        return self.cached(key, lambda: self._make(key))

    def _make(self, key) -> QwenVLBatch:
        samples = self.batch_samples(*key)
        B, S = len(samples), self.cfg.seq_len
        ids = np.full((B, S), self.special.pad, np.int64)
        mask = np.zeros((B, S), np.int64)
        labels = np.full((B, S), IGNORE, np.int64)
        for b, s in enumerate(samples):
            e, L = s.enc, s.enc.length
            ids[b, :L], mask[b, :L] = e.ids, 1
            labels[b, :L] = np.where(e.answer, e.ids, IGNORE)
        grids: List[tuple] = [g for s in samples for g in s.enc.grids]
        videos = [v for s in samples for v in s.enc.videos]
        extra = 0 if grids or videos else 1
        return QwenVLBatch(input_ids=ids, attention_mask=mask, labels=labels,
                           image_grid_thw=np.asarray(grids + [self.filler_grid] * extra, np.int64).reshape(-1, 3),
                           images_per_sample=[len(s.files) for s in samples], merge_size=self.fmt.merge_size,
                           load=lambda: self.load_pixels(*key), extra_images=extra,
                           sample_ids=[s.id for s in samples],
                           video_grid_thw=np.asarray([v.grid for v in videos], np.int64).reshape(-1, 3),
                           second_per_grid_ts=[v.second_per_grid_t for v in videos],
                           videos_per_sample=[len(s.enc.videos) for s in samples],
                           load_videos=lambda: self.load_videos(*key))

    def load_videos(self, step: int, micro: int) -> np.ndarray:
        """(video patches, C*tp*P*P) float32 of one micro-batch's videos, decoded now (PyAV / Pillow)."""
        videos = [v for s in self.batch_samples(step, micro) for v in s.enc.videos]
        rows = [self.layout.video_values(v)[0] for v in videos]
        return np.concatenate(rows).astype(np.float32, copy=False) if rows else np.zeros((0, self.patch_dim),
                                                                                          np.float32)

    def load_pixels(self, step: int, micro: int) -> np.ndarray:
        """(num_patches, C*tp*P*P) float32 of one micro-batch (the filler is zeros)."""
        samples = self.batch_samples(step, micro)
        files = [f for s in samples for f in s.files]
        want = [g for s in samples for g in s.enc.grids]
        out = self.pixels.get(step, micro)
        if not out:
            if any(s.enc.videos for s in samples):   # the videos are the encoder's work: no filler
                return np.zeros((0, self.patch_dim), np.float32)
            m = self.fmt.merge_size
            return np.zeros((m * m, self.patch_dim), np.float32)
        for path, (_, grid), w in zip(files, out, want):
            got = tuple(int(x) for x in grid)
            if got != tuple(w):
                raise RuntimeError(f"data: image {path}: grid_mismatch: the processor's grid {got} is not {tuple(w)} "
                                   "from the image header (changed since the index was built? hyperparallel "
                                   "data check RECIPE)")
        return np.concatenate([pv for pv, _ in out]).astype(np.float32, copy=False)
