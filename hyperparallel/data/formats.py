"""Micro-batch layouts a model can ask for: the model adapter's ``data_format()`` answer, checked.

* ``{"format": "merge_index", "image_tokens": k}``: every image placeholder becomes ``k`` rows of
  the encoder's output, gathered by a merge index (:class:`~.batch.MicroBatch`);
* ``{"format": "qwen_vl", "patch_size": P, "temporal_patch_size": tp, "merge_size": m,
  "image_token_id": i, "video_token_id": v, "vision_start_token_id": s, "vision_end_token_id": e}``:
  token ids with image pads, labels and Qwen's flattened patches (:class:`~.batch.QwenVLBatch`).

A bad answer is the model adapter's fault: SpecError('model', ...).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError, is_whole, whole

MERGE_INDEX, QWEN_VL = "merge_index", "qwen_vl"
FORMATS = (MERGE_INDEX, QWEN_VL)
QWEN_KEYS = ("patch_size", "temporal_patch_size", "merge_size", "image_token_id", "video_token_id",
             "vision_start_token_id", "vision_end_token_id")


@dataclass(frozen=True)
class MergeIndex:
    image_tokens: int
    name = MERGE_INDEX


@dataclass(frozen=True)
class QwenVL:
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    name = QWEN_VL

    @property
    def factor(self) -> int:
        """Image sides are rounded to multiples of this (patch_size x merge_size)."""
        return self.patch_size * self.merge_size


def resolve_format(answer):
    """A :class:`MergeIndex` or :class:`QwenVL` from ``answer``: a zero-argument callable (called
    here), a dict as above, an already resolved format, or an int (shorthand for merge_index)."""
    if callable(answer):
        answer = answer()
    if isinstance(answer, (MergeIndex, QwenVL)):
        return answer
    if is_whole(answer):
        answer = {"format": MERGE_INDEX, "image_tokens": answer}
    if not isinstance(answer, dict):
        raise SpecError("model", f"data_format() must return a dict, got {type(answer).__name__}")
    kind = answer.get("format")
    if kind == MERGE_INDEX:
        return MergeIndex(whole("model.data_format().image_tokens", answer.get("image_tokens")))
    if kind == QWEN_VL:
        lows = {"patch_size": 1, "temporal_patch_size": 1, "merge_size": 1}
        return QwenVL(**{k: whole(f"model.data_format().{k}", answer.get(k), lows.get(k, 0)) for k in QWEN_KEYS})
    raise SpecError("model", f"data_format() format {kind!r} unknown (known: {', '.join(FORMATS)})")
