"""The ``qwen_vl`` micro-batch layout's entry in the data layer's registry (:mod:`hyperparallel.data.formats`).

The adapter's answer ``{"format": "qwen_vl", "patch_size": P, "temporal_patch_size": tp, "merge_size": m,
"image_token_id": i, "video_token_id": v, "vision_start_token_id": s, "vision_end_token_id": e}``: token
ids with image pads, labels and Qwen's flattened patches (:class:`~.batch.QwenVLBatch`). The ``data:`` keys
only this layout reads (:data:`KEYS`), their defaults (Qwen2-VL's ``preprocessor_config.json``, :mod:`.image`)
and checks; its index side is :mod:`.layout`, its source :mod:`.source`. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...data.formats import Layout
from ...errors import SpecError, whole

QWEN_VL = "qwen_vl"
QWEN_KEYS = ("patch_size", "temporal_patch_size", "merge_size", "image_token_id", "video_token_id",
             "vision_start_token_id", "vision_end_token_id")
KEYS = ("min_pixels", "max_pixels", "image_mean", "image_std", "preprocessor_config", "system_prompt", "fps",
        "min_frames", "max_frames", "shape_buckets")   # shape_buckets: conversations' own field, read by this layout too
#: how a video lays out in the token ids: one ``<|vision_start|>`` group of all its frames (Qwen2.5-VL), or a
#: group per temporal grid step with its timestamp as text before it (Qwen3-VL); the adapter's answer names it
VIDEO_LAYOUTS = ("grouped", "per_frame")


@dataclass(frozen=True)
class QwenVL:
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    video_layout: str = "grouped"
    name = QWEN_VL

    @property
    def factor(self) -> int:
        """Image sides are rounded to multiples of this (patch_size x merge_size)."""
        return self.patch_size * self.merge_size


def resolve(answer: dict) -> QwenVL:
    lows = {"patch_size": 1, "temporal_patch_size": 1, "merge_size": 1}
    video = answer.get("video_layout", "grouped")
    if video not in VIDEO_LAYOUTS:
        raise SpecError("model.data_format().video_layout", f"{video!r}; allowed: {', '.join(VIDEO_LAYOUTS)}")
    return QwenVL(**{k: whole(f"model.data_format().{k}", answer.get(k), lows.get(k, 0)) for k in QWEN_KEYS},
                  video_layout=video)


def defaults() -> dict:
    from .image import CLIP_MEAN, CLIP_STD, MAX_PIXELS, MIN_PIXELS
    from .video import FPS, MAX_FRAMES, MIN_FRAMES
    return {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "image_mean": list(CLIP_MEAN),
            "image_std": list(CLIP_STD), "preprocessor_config": None, "system_prompt": None, "fps": FPS,
            "min_frames": MIN_FRAMES, "max_frames": MAX_FRAMES}


def file_defaults(sec: dict) -> dict:
    """The keys ``data.preprocessor_config`` (a Hugging Face ``preprocessor_config.json``) sets."""
    if sec.get("preprocessor_config") is None:
        return {}
    from .image import read_preprocessor_config
    return read_preprocessor_config(sec["preprocessor_config"])


def validate(cfg) -> None:
    from ...data.conversations_config import check_rgb
    from ...data.text import IMAGE, VIDEO
    for k in ("min_pixels", "max_pixels"):
        whole(f"data.{k}", getattr(cfg, k))
    if cfg.min_pixels > cfg.max_pixels:
        raise SpecError("data.min_pixels", f"{cfg.min_pixels} > data.max_pixels {cfg.max_pixels}")
    fps = cfg.fps
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < float("inf"):
        raise SpecError("data.fps", f"frames sampled per second of a video file: a number > 0, got {fps!r}")
    whole("data.min_frames", cfg.min_frames, 1)
    whole("data.max_frames", cfg.max_frames, 1)
    if cfg.min_frames > cfg.max_frames:
        raise SpecError("data.min_frames", f"{cfg.min_frames} > data.max_frames {cfg.max_frames}")
    check_rgb("image_mean", cfg.image_mean)
    check_rgb("image_std", cfg.image_std, positive=True)
    if cfg.system_prompt is not None:
        if not isinstance(cfg.system_prompt, str):
            raise SpecError("data.system_prompt", f"a string (or null: none), got {cfg.system_prompt!r}")
        if IMAGE in cfg.system_prompt or VIDEO in cfg.system_prompt:
            raise SpecError("data.system_prompt", f"no {IMAGE} or {VIDEO} placeholder here (a sample's "
                                                  "images go in its own turns)")


def check(cfg, fmt: QwenVL) -> None:
    """A ``preprocessor_config`` whose patch geometry is not the model's is refused."""
    if cfg.preprocessor_config is not None:
        from .image import check_geometry
        check_geometry(cfg.preprocessor_config, fmt)


def index(cfg, fmt: QwenVL, tok):
    from .layout import QwenLayout
    return QwenLayout(cfg, fmt, tok)


def source(cfg, fmt: QwenVL, seed: int):
    from .source import QwenVLSource
    return QwenVLSource(cfg, fmt, seed)


LAYOUT = Layout(QWEN_VL, resolve, index, source, keys=KEYS, defaults=defaults, file_defaults=file_defaults,
                validate=validate, check=check)
