"""The ``merge_index`` layout, the data layer's own (``{"format": "merge_index", "image_tokens": k}``):
every image placeholder becomes ``k`` rows of the encoder's output, gathered by a merge index
(:class:`~.batch.MicroBatch`); registered in :mod:`.formats` when the data package is imported.
Its index side is :mod:`.merge_layout`, its source :class:`~.conversations.ConversationsSource`."""
from __future__ import annotations

from dataclasses import dataclass

from .formats import MERGE_INDEX, Layout, register
from ..errors import whole

KEYS = ("image_size", "patch", "mean", "std", "shape_buckets")   # data keys only this layout reads


@dataclass(frozen=True)
class MergeIndex:
    image_tokens: int
    name = MERGE_INDEX


def _resolve(answer: dict) -> MergeIndex:
    return MergeIndex(whole("model.data_format().image_tokens", answer.get("image_tokens")))


def _index(cfg, fmt, tok):
    from .merge_layout import MergeLayout
    return MergeLayout(cfg, fmt.image_tokens, tok)


def _source(cfg, fmt, seed):
    from .conversations import ConversationsSource
    return ConversationsSource(cfg, fmt, seed)


LAYOUT = register(Layout(MERGE_INDEX, _resolve, _index, _source, keys=KEYS))
