"""The ``qwen_vl`` layout's micro-batch (:mod:`.format`): token ids, labels, image and video grids now, pixels
on demand (``pixel_values`` / ``pixel_values_videos`` are loaded on first access, so a rank that never runs
the encoder's first chunk never decodes an image or a video)."""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np


class QwenVLBatch:
    """One micro-batch as Qwen-VL models take it (Hugging Face names), numpy arrays.

    * ``input_ids`` int64 (B, S): Qwen's chat layout, right-padded with ``<|endoftext|>``;
      ``attention_mask`` int64 (B, S): 1 on real tokens; ``labels`` int64 (B, S): the token id on
      answer tokens, -100 elsewhere (the model shifts);
    * ``image_grid_thw`` int64 (num_images, 3): (t, h, w) in patches of every image in sample
      order, then the filler (``extra_images`` = 1: grid (1, m, m), zero pixels, no image token);
    * ``pixel_values`` float32 (image patches, C*tp*P*P): Qwen2VLImageProcessor's rows, loaded on
      first access (``load()``); everything else is known without pixels;
    * ``video_grid_thw`` int64 (num_videos, 3), ``second_per_grid_ts`` float32 (num_videos,) and
      ``pixel_values_videos`` float32 (video patches, C*tp*P*P, loaded by ``load_videos()``): every
      video in sample order, as the processor makes them (``<|video_pad|>`` tokens in ``input_ids``).
    * ``segments`` (``data.packing``): per row the token counts of the samples packed into it, in order
      (row b holds sample k at ``sum(segments[b][:k]) ..``); None: one sample per row. A packed sample's first
      label is -100 (the position before it, the previous sample's last, scores nothing, as unpacked);
      ``images_per_sample`` and ``sample_ids`` are per sample, in packed order.

    The encoder runs once over every image's patches, then every video's (:attr:`vision_grid`): its
    attention never crosses a frame, so that is what the model's two calls compute.
    """

    def __init__(self, input_ids: np.ndarray, attention_mask: np.ndarray, labels: np.ndarray,
                 image_grid_thw: np.ndarray, images_per_sample: List[int], merge_size: int,
                 load: Callable[[], np.ndarray], extra_images: int = 0, sample_ids: Optional[List[str]] = None,
                 segments: Optional[List[List[int]]] = None, pad_id: int = 0,
                 video_grid_thw=None, second_per_grid_ts=None, videos_per_sample: Optional[List[int]] = None,
                 load_videos: Optional[Callable[[], np.ndarray]] = None):
        self.input_ids, self.attention_mask, self.labels = input_ids, attention_mask, labels
        self.image_grid_thw = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
        self.images_per_sample = [int(n) for n in images_per_sample]
        self.extra_images = int(extra_images)
        self.sample_ids = sample_ids
        self.merge_size = int(merge_size)
        self.pad_id = int(pad_id)   # the padding token (``<|endoftext|>``)
        self.segments = None if segments is None else [[int(n) for n in row] for row in segments]
        self._pixels, self._load = None, load
        self.video_grid_thw = np.asarray(video_grid_thw if video_grid_thw is not None else [], np.int64).reshape(-1, 3)
        self.second_per_grid_ts = np.asarray(second_per_grid_ts if second_per_grid_ts is not None else [],
                                             np.float32).reshape(-1)
        self.videos_per_sample = [int(n) for n in (videos_per_sample or [0] * len(self.images_per_sample))]
        self._videos, self._load_videos = None, load_videos
        if len(self.second_per_grid_ts) != self.num_videos:
            raise ValueError(f"{len(self.second_per_grid_ts)} second_per_grid_ts for {self.num_videos} videos")

    @property
    def segment_ids(self) -> np.ndarray:
        """(B, S) int64: 1, 2, ... for the samples of each row in order, 0 on padding (unpacked: 1 on
        real tokens)."""
        if self.segments is None:
            return (np.asarray(self.attention_mask) != 0).astype(np.int64)
        out = np.zeros(self.input_ids.shape, np.int64)
        for b, row in enumerate(self.segments):
            out[b, :sum(row)] = np.repeat(np.arange(1, len(row) + 1), row)
        return out

    def unpacked(self) -> "QwenVLBatch":
        """The same samples one per row (right-padded to the same sequence length), in packed order: the
        images stay in order, so the grids and the pixels are the same arrays. Unpacked: this batch."""
        if self.segments is None:
            return self
        S = self.input_ids.shape[1]
        n = sum(len(r) for r in self.segments)
        ids, mask = np.full((n, S), self.pad_id, np.int64), np.zeros((n, S), np.int64)
        labels = np.full((n, S), -100, np.int64)
        k = 0
        for b, row in enumerate(self.segments):
            off = 0
            for L in row:
                ids[k, :L], mask[k, :L], labels[k, :L] = self.input_ids[b, off:off + L], 1, self.labels[b, off:off + L]
                off, k = off + L, k + 1
        out = QwenVLBatch(ids, mask, labels, self.image_grid_thw, self.images_per_sample, self.merge_size,
                          self._load, self.extra_images, self.sample_ids, pad_id=self.pad_id,
                          video_grid_thw=self.video_grid_thw, second_per_grid_ts=self.second_per_grid_ts,
                          videos_per_sample=self.videos_per_sample, load_videos=self._load_videos)
        out._pixels, out._videos = self._pixels, self._videos
        if self._pixels is None:   # one decode serves both: the unpacked batch reads this one's pixels
            out._load = lambda: self.pixel_values
        if self._videos is None and self._load_videos is not None:
            out._load_videos = lambda: self.pixel_values_videos
        return out

    @property
    def loss_tokens(self) -> int:
        """Positions the loss is a mean over: labels after the model's shift that are not -100."""
        return int(np.count_nonzero(self.labels[:, 1:] != -100))

    @property
    def num_images(self) -> int:
        """Images the encoder sees, the filler included."""
        return int(self.image_grid_thw.shape[0])

    @property
    def num_videos(self) -> int:
        return int(self.video_grid_thw.shape[0])

    @property
    def image_patches(self) -> int:
        """Rows of ``pixel_values``: sum of t*h*w over every image, the filler included."""
        return int(self.image_grid_thw.prod(axis=1).sum())

    @property
    def num_patches(self) -> int:
        """Patches the encoder runs: every image's (the filler included), then every video's."""
        return self.image_patches + int(self.video_grid_thw.prod(axis=1).sum())

    @property
    def vision_grid(self) -> np.ndarray:
        """(t, h, w) of every item the encoder runs on, in its order: the images (filler included), the videos."""
        return np.concatenate([self.image_grid_thw, self.video_grid_thw]).astype(np.int64)

    @property
    def num_video_tokens(self) -> int:
        """LLM positions the videos fill (``<|video_pad|>`` tokens)."""
        return int(self.video_grid_thw.prod(axis=1).sum()) // (self.merge_size ** 2)

    @property
    def num_image_tokens(self) -> int:
        """LLM positions the real images fill (``<|image_pad|>`` tokens): their t*h*w / merge_size^2."""
        real = self.image_grid_thw[:self.num_images - self.extra_images]
        return int(real.prod(axis=1).sum()) // (self.merge_size ** 2)

    @property
    def pixels_loaded(self) -> bool:
        return self._pixels is not None

    @property
    def pixel_values(self) -> np.ndarray:
        if self._pixels is None:
            p = self._load()
            if p.shape[0] != self.image_patches:
                raise RuntimeError(f"data: loaded {p.shape[0]} patch rows for a micro-batch of {self.image_patches}")
            self._pixels, self._load = p, None
        return self._pixels

    @property
    def pixel_values_videos(self) -> Optional[np.ndarray]:
        """The videos' patch rows (None without videos)."""
        if not self.num_videos:
            return None
        if self._videos is None:
            p = self._load_videos()
            want = int(self.video_grid_thw.prod(axis=1).sum())
            if p.shape[0] != want:
                raise RuntimeError(f"data: loaded {p.shape[0]} video patch rows for a micro-batch of {want}")
            self._videos, self._load_videos = p, None
        return self._videos

    @property
    def encoder_pixels(self) -> np.ndarray:
        """What the encoder's first chunk takes: ``pixel_values`` then ``pixel_values_videos``, row after row."""
        v = self.pixel_values_videos
        return self.pixel_values if v is None else np.concatenate([self.pixel_values, v])
