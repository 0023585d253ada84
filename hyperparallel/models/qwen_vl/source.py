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
from ...data.conversations_config import ConversationsConfig, bucket
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
        rows = self.batch_rows(*key)
        samples = [s for row in rows for s in row]
        B, S = len(rows), self.cfg.seq_len
        ids = np.full((B, S), self.special.pad, np.int64)
        mask = np.zeros((B, S), np.int64)
        labels = np.full((B, S), IGNORE, np.int64)
        for b, row in enumerate(rows):
            off = 0
            for s in row:
                e, L = s.enc, s.enc.length
                ids[b, off:off + L], mask[b, off:off + L] = e.ids, 1
                labels[b, off:off + L] = np.where(e.answer, e.ids, IGNORE)
                labels[b, off] = IGNORE   # scored by no position (the shift), as the first token unpacked
                off += L
        grids: List[tuple] = [g for s in samples for g in s.enc.grids]
        videos = [v for s in samples for v in s.enc.videos]
        extra = self.fillers(grids, B, videos)
        return QwenVLBatch(input_ids=ids, attention_mask=mask, labels=labels,
                           image_grid_thw=np.asarray(grids + [self.filler_grid] * extra, np.int64).reshape(-1, 3),
                           images_per_sample=[len(s.files) for s in samples], merge_size=self.fmt.merge_size,
                           load=lambda: self.load_pixels(*key), extra_images=extra,
                           sample_ids=[s.id for s in samples], pad_id=self.special.pad,
                           segments=[[s.enc.length for s in row] for row in rows] if self.packed else None,
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

    def fillers(self, grids, batch: int, videos=()) -> int:
        """Filler images (grid (1, m, m): one merged token each, zero pixels, no image token) after ``grids``: one
        when there is neither an image nor a video (the videos are the encoder's work otherwise); with
        ``data.shape_buckets: pow2`` as many as pad the merged tokens (images' and videos') up to a power of two
        (:func:`~hyperparallel.data.conversations_config.bucket`, capped at ``batch * seq_len``, the most visual
        tokens a micro-batch holds), so a compiled encoder chunk and the LLM's first chunk see at most ``log2``
        of the cap input shapes."""
        extra = 0 if grids or videos else 1
        if self.cfg.shape_buckets == "pow2":
            m2 = self.fmt.merge_size ** 2
            tokens = (sum(int(np.prod(g)) for g in grids) + sum(int(np.prod(v.grid)) for v in videos)) // m2 + extra
            extra += bucket(tokens, batch * self.cfg.seq_len) - tokens
        return extra

    def encoder_patches(self, patches: int) -> int:
        """With ``shape_buckets: pow2`` the patches padded as :meth:`fillers` pads them."""
        if self.cfg.shape_buckets == "pow2":
            m2 = self.fmt.merge_size ** 2
            return bucket(max(1, int(patches) // m2), self.cfg.micro_batch_size * self.cfg.seq_len) * m2
        return super().encoder_patches(patches)

    def load_pixels(self, step: int, micro: int) -> np.ndarray:
        """(num_patches, C*tp*P*P) float32 of one micro-batch (the filler is zeros)."""
        samples = self.batch_samples(step, micro)
        files = [f for s in samples for f in s.files]
        want = [g for s in samples for g in s.enc.grids]
        out = self.pixels.get(step, micro)
        m2 = self.fmt.merge_size ** 2
        videos = [v for s in samples for v in s.enc.videos]
        filler = np.zeros((self.fillers(want, len(samples), videos) * m2, self.patch_dim), np.float32)
        if not out:
            return filler
        for path, (_, grid), w in zip(files, out, want):
            got = tuple(int(x) for x in grid)
            if got != tuple(w):
                raise RuntimeError(f"data: image {path}: grid_mismatch: the processor's grid {got} is not {tuple(w)} "
                                   "from the image header (changed since the index was built? hyperparallel "
                                   "data check RECIPE)")
        return np.concatenate([pv for pv, _ in out] + [filler]).astype(np.float32, copy=False)
