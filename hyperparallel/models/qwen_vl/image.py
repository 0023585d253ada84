"""Qwen-VL images: the grid from an image's header size, and the pixels by transformers' processor.

* **Grid.** Qwen's ``smart_resize`` rounds each side to a multiple of ``patch_size x merge_size``,
  scaled so the area lies within ``[min_pixels, max_pixels]``; an image's grid is ``(1, H'/P, W'/P)``
  (an image is repeated ``temporal_patch_size`` times in time, so ``t = 1``) and it takes
  ``t*h*w / merge_size^2`` LLM tokens. transformers' ``smart_resize`` is used when it imports
  (it needs no torch), else :func:`own_smart_resize`, the same rule restated.
* **Pixels.** :class:`QwenPixels` runs transformers' slow ``Qwen2VLImageProcessor`` (numpy + PIL:
  bicubic resize, rescale 1/255, normalize, flatten to ``(t*h*w, C*tp*P*P)`` in merge-block order)
  on one image file's bytes, so the values are exactly the processor's.
* **Defaults** are Qwen2-VL / Qwen2.5-VL's ``preprocessor_config.json``; a recipe may name such a
  file (:func:`read_preprocessor_config`).
"""
from __future__ import annotations

import io
import json
import math
import os
from typing import Tuple

import numpy as np

from ...errors import SpecError

MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 16384
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
GEOMETRY = ("patch_size", "temporal_patch_size", "merge_size")
# preprocessor_config.json settings the data layer does not vary: refused when a file sets another value
FIXED = {"do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3}
MAX_ASPECT = 200


def own_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> Tuple[int, int]:
    """Qwen's resize rule restated: (H', W'), multiples of ``factor``; ValueError past aspect 200."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT}, "
                         f"got {max(height, width) / min(height, width)}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def _quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # no "PyTorch not found" line on stderr


def _transformers_smart_resize():
    _quiet_transformers()
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    except ImportError:
        return None
    return smart_resize


_SMART_RESIZE = []


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> Tuple[int, int]:
    """transformers' ``smart_resize`` where it imports, else :func:`own_smart_resize`."""
    if not _SMART_RESIZE:
        _SMART_RESIZE.append(_transformers_smart_resize() or own_smart_resize)
    h, w = _SMART_RESIZE[0](int(height), int(width), factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return int(h), int(w)


def image_grid(height: int, width: int, fmt, min_pixels: int, max_pixels: int) -> Tuple[int, int, int]:
    """(t, h, w) in patches of an image of ``height x width`` pixels (``fmt``: a :class:`~.format.QwenVL`)."""
    h, w = smart_resize(height, width, fmt.factor, min_pixels, max_pixels)
    return 1, h // fmt.patch_size, w // fmt.patch_size


def image_tokens(grid, merge_size: int) -> int:
    """LLM tokens of one image of grid (t, h, w)."""
    return int(np.prod(grid)) // (merge_size * merge_size)


# -- preprocessor_config.json ------------------------------------------------------------------

def _load_json(path) -> dict:
    key = "data.preprocessor_config"
    if not isinstance(path, str) or not path:
        raise SpecError(key, f"a path to a Hugging Face preprocessor_config.json, got {path!r}")
    if not os.path.isfile(path):
        raise SpecError(key, f"file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(key, f"{path}: not a JSON file ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise SpecError(key, f"{path}: expected a JSON object")
    return d


def read_preprocessor_config(path) -> dict:
    """The data keys a Hugging Face ``preprocessor_config.json`` sets: ``min_pixels``/``max_pixels``
    (else ``size.shortest_edge``/``longest_edge``), ``image_mean``, ``image_std``."""
    d = _load_json(path)
    for k, want in FIXED.items():
        if k in d and d[k] != want:
            raise SpecError("data.preprocessor_config", f"{path}: {k} {d[k]!r} is not supported "
                                                        f"(the data layer always uses {want!r})")
    if "rescale_factor" in d and not (isinstance(d["rescale_factor"], (int, float))
                                      and abs(d["rescale_factor"] - 1 / 255) < 1e-9):
        raise SpecError("data.preprocessor_config", f"{path}: rescale_factor {d['rescale_factor']!r} is not "
                                                    "supported (the data layer always uses 1/255)")
    size = d.get("size") if isinstance(d.get("size"), dict) else {}
    out = {}
    for key, alt in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        v = d.get(key, size.get(alt))
        if v is not None:
            out[key] = v
    for key in ("image_mean", "image_std"):
        if key in d:
            out[key] = list(d[key]) if isinstance(d[key], (list, tuple)) else d[key]
    return out


def check_geometry(path: str, fmt) -> None:
    """The file's patch_size / temporal_patch_size / merge_size must be the model's."""
    d = _load_json(path)
    for k in GEOMETRY:
        if k in d and d[k] != getattr(fmt, k):
            raise SpecError("data.preprocessor_config", f"{path}: {k} {d[k]!r} but the model's is "
                                                        f"{getattr(fmt, k)}")


# -- pixels -------------------------------------------------------------------------------------

def image_processor(fmt, min_pixels: int, max_pixels: int, mean, std):
    """transformers' slow ``Qwen2VLImageProcessor`` with these settings (runs without torch)."""
    _quiet_transformers()
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    return Qwen2VLImageProcessor(patch_size=fmt.patch_size, temporal_patch_size=fmt.temporal_patch_size,
                                 merge_size=fmt.merge_size, min_pixels=int(min_pixels), max_pixels=int(max_pixels),
                                 image_mean=[float(x) for x in mean], image_std=[float(x) for x in std])


class QwenPixels:
    """One image file's bytes (uint8 array) -> (``pixel_values`` (t*h*w, C*tp*P*P) float32,
    ``grid`` (3,) int64), exactly as the processor makes them; the same callable serves the
    read-ahead pipeline and eager decoding."""

    def __init__(self, fmt, min_pixels: int, max_pixels: int, mean, std):
        self.proc = image_processor(fmt, min_pixels, max_pixels, mean, std)

    def __call__(self, data: np.ndarray):
        from PIL import Image
        with Image.open(io.BytesIO(np.asarray(data, np.uint8).tobytes())) as im:
            # PIL images are height x width x channels: said, not guessed (the processor's guess takes an
            # image 1 or 3 pixels high for channels-first)
            out = self.proc(images=[im], return_tensors="np", input_data_format="channels_last")
        return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"][0], np.int64)
