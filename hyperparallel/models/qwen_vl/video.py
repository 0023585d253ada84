"""Qwen-VL videos: which frames are sampled, the grid, the LLM tokens and the pixels.

* **Frames of a video file** (Qwen's ``qwen_vl_utils.smart_nframes`` rule, mindone's copy in
  ``mindone/transformers/models/qwen2_vl/qwen_vl_utils``): with the file's ``total`` frames at
  ``video_fps``, ``n = total / video_fps * data.fps`` clamped to ``[ceil2(data.min_frames),
  floor2(min(data.max_frames, total))]`` and rounded to a multiple of ``FRAME_FACTOR = 2``; refused
  unless ``2 <= n <= total``. The frames taken are ``round(linspace(0, total - 1, n))``. The sampled
  rate is ``n / total * video_fps``.
* **A list of frame image files** is the video's frames as given (``qwen_vl_utils`` takes a list
  whole), at ``data.fps``; more than ``data.max_frames`` of them is refused.
* **Grid** ``(ceil(n / tp), H'/P, W'/P)``: every frame is resized to the first frame's
  ``smart_resize`` size within ``[data.min_pixels, data.max_pixels]`` (the frames of a list may differ
  in size), and the frames are padded to a multiple of ``temporal_patch_size`` by repeating the last
  one, as the processor does. A video takes ``t*h*w / merge_size^2`` LLM tokens.
* ``second_per_grid_t = temporal_patch_size / sampled rate`` (Qwen2.5-VL's processor); M-RoPE's
  temporal positions follow from it (:func:`.side.rope_index`).
* **Pixels**: transformers' slow ``Qwen2VLImageProcessor`` on the decoded frames (its video path:
  the same resize, rescale, normalize and flatten as images, ``temporal_patch_size`` frames per grid
  step), so the rows are the processor's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

FPS, MIN_FRAMES, MAX_FRAMES, FRAME_FACTOR = 2.0, 4, 768, 2


class FramesError(ValueError):
    """Qwen's rule cannot sample the video (one line)."""


def sampled_frames(total: int, video_fps: float, fps: float, min_frames: int, max_frames: int) -> int:
    """Frames sampled from a video file of ``total`` frames at ``video_fps`` (module docstring)."""
    lo = math.ceil(min_frames / FRAME_FACTOR) * FRAME_FACTOR
    hi = math.floor(min(max_frames, total) / FRAME_FACTOR) * FRAME_FACTOR
    n = min(max(total / video_fps * fps, lo), hi)
    n = round(n / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= n <= total:
        raise FramesError(f"{total} frame(s) at {video_fps:g} fps give {n} sampled frames; Qwen's rule needs "
                          f"{FRAME_FACTOR} to {total} (data.fps {fps:g}, data.min_frames {min_frames}, "
                          f"data.max_frames {max_frames})")
    return int(n)


def frame_indices(total: int, n: int) -> Tuple[int, ...]:
    """The ``n`` frames taken of ``total``: ``round(linspace(0, total - 1, n))``."""
    return tuple(int(i) for i in np.linspace(0, total - 1, n).round().astype(np.int64))


@dataclass(frozen=True)
class QwenVideo:
    """One video of a sample: ``source`` a file path or a tuple of frame image paths; ``indices`` the
    frames taken of a file (None: a frame list, all of it); ``grid`` (t, h, w); ``second_per_grid_t``;
    ``video_fps``: the file's frame rate (a frame list: ``data.fps``)."""

    source: object
    indices: Optional[Tuple[int, ...]]
    grid: Tuple[int, int, int]
    second_per_grid_t: float
    video_fps: float

    def timestamps(self, temporal_patch_size: int) -> list:
        """Seconds of each temporal grid step (Qwen3-VL's processor: the frames' ``index / video_fps``,
        padded with the last to a multiple of ``temporal_patch_size``, the first and last of each step
        averaged)."""
        idx = list(self.indices) if self.indices is not None else list(range(len(self.source)))
        tp = int(temporal_patch_size)
        idx += [idx[-1]] * (-len(idx) % tp)
        secs = [i / self.video_fps for i in idx]
        return [(secs[i] + secs[i + tp - 1]) / 2 for i in range(0, len(secs), tp)]

    @property
    def name(self) -> str:
        return self.source if isinstance(self.source, str) else f"{self.source[0]} (+{len(self.source) - 1} frames)"


def video_grid(frames: int, height: int, width: int, fmt, min_pixels: int, max_pixels: int) -> Tuple[int, int, int]:
    """(t, h, w) in patches of ``frames`` frames resized from ``height x width`` (module docstring)."""
    from .image import smart_resize
    h, w = smart_resize(height, width, fmt.factor, min_pixels, max_pixels)
    tp = fmt.temporal_patch_size
    return -(-int(frames) // tp), h // fmt.patch_size, w // fmt.patch_size


def video_tokens(grid, merge_size: int) -> int:
    return int(np.prod(grid)) // (merge_size * merge_size)


class QwenVideoPixels:
    """A video's frames ((H, W, 3) uint8 arrays, in order) -> (``pixel_values_videos`` (t*h*w, C*tp*P*P)
    float32, ``grid`` (3,) int64), as the processor makes them."""

    def __init__(self, fmt, min_pixels: int, max_pixels: int, mean, std):
        from .image import image_processor
        self.proc = image_processor(fmt, min_pixels, max_pixels, mean, std)
        # its video path warns once that it is kept for compatibility (the values are the same as its images')
        from transformers.utils import logging
        logging.get_logger("transformers.models.qwen2_vl.image_processing_qwen2_vl").setLevel(logging.ERROR)

    def __call__(self, frames):
        out = self.proc(images=None, videos=[list(frames)], return_tensors="np", input_data_format="channels_last")
        return (np.asarray(out["pixel_values_videos"], np.float32),
                np.asarray(out["video_grid_thw"][0], np.int64))


def read_video(video: QwenVideo):
    """The decoded frames of ``video`` (:mod:`hyperparallel.data.video`)."""
    from ...data.video import read_frame_images, read_frames
    if isinstance(video.source, str):
        return read_frames(video.source, video.indices)
    return read_frame_images(video.source)
