"""Qwen's chat layout of one conversation: token ids, answer marks, image pads.

Turns in order (``system_prompt``, when set and the sample has no system turn, comes first)::

    system -> <|im_start|>system\\n{value}<|im_end|>\\n
    human  -> <|im_start|>user\\n{value}<|im_end|>\\n
    gpt    -> <|im_start|>assistant\\n{value}<|im_end|>\\n

Each ``<image>`` placeholder (human or system turn) becomes ``<|vision_start|>``, the image's
token count of ``<|image_pad|>`` and ``<|vision_end|>``; a ``<video>`` placeholder the video's
``<|video_pad|>`` tokens the same way (Qwen2.5-VL: one group of all its frames), or (Qwen3-VL,
``per_frame``) a group of each temporal grid step's tokens, each after its timestamp as text,
``<{seconds:.1f} seconds>``, as Qwen3-VL's processor writes it. Special tokens are inserted by id; the
text between them is encoded piece by piece (as a tokenizer splits at its added tokens).
Answer tokens, the only ones with labels: a gpt turn's content and its ``<|im_end|>`` (a token
counts as content when its characters reach past the ``assistant\\n`` header).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from ...data.text import IMAGE, VIDEO, SampleProblem, Tok
from ...errors import SpecError

ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
SPECIAL = {"im_start": "<|im_start|>", "im_end": "<|im_end|>", "vision_start": "<|vision_start|>",
           "vision_end": "<|vision_end|>", "image_pad": "<|image_pad|>", "pad": "<|endoftext|>",
           "video_pad": "<|video_pad|>"}
OPTIONAL = ("video_pad",)   # a tokenizer without it lays out samples without videos
# special token -> the data_format() id it must equal
MODEL_IDS = {"image_pad": "image_token_id", "vision_start": "vision_start_token_id",
             "vision_end": "vision_end_token_id", "video_pad": "video_token_id"}
_PLACEHOLDER = re.compile(r"(<image>|<video>)")


@dataclass(frozen=True)
class QwenTokens:
    """Ids of the special tokens of the layout (``pad``: ``<|endoftext|>``, the right padding)."""

    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    image_pad: int
    pad: int
    video_pad: Optional[int] = None

    @staticmethod
    def of(tok: Tok, fmt) -> "QwenTokens":
        """Looked up in ``tok``; SpecError('data.tokenizer') if one is missing or is not the model's id."""
        ids = {}
        for name, token in SPECIAL.items():
            i = tok.token_id(token)
            if i is None and name in OPTIONAL:
                continue
            if i is None:
                use = "the padding" if name == "pad" else "Qwen's chat layout"
                raise SpecError("data.tokenizer", f"{tok.path} has no {token} token ({use} needs it)")
            ids[name] = int(i)
        for name, key in MODEL_IDS.items():
            if name in ids and ids[name] != getattr(fmt, key):
                raise SpecError("data.tokenizer", f"{tok.path}: {SPECIAL[name]} is id {ids[name]} but the "
                                                  f"model's {key} is {getattr(fmt, key)}")
        return QwenTokens(**ids)


@dataclass(frozen=True)
class QwenEncoded:
    """One sample: ``ids`` int64, ``answer`` bool (labelled tokens), ``grids`` (t, h, w) per image,
    ``videos`` its :class:`~.video.QwenVideo` s."""

    ids: np.ndarray
    answer: np.ndarray
    grids: tuple
    videos: tuple = ()

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])


def encode_chat(turns, tok: Tok, special: QwenTokens, image_token_counts: Sequence[int],
                system_prompt: Optional[str] = None, videos: Sequence = ()) -> List:
    """(ids, answer marks) of one sample; ``image_token_counts``: pads of each image, in order;
    ``videos``: per video (its groups' pad counts, the text before each group: '' or a timestamp)."""
    if not isinstance(turns, list) or not turns:
        raise SampleProblem("bad_record", "'conversations' must be a non-empty list of turns")
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or turn.get("from") not in ROLES:
            raise SampleProblem("bad_record", f"turn {j}: expected {{\"from\": human|gpt|system, \"value\": str}}")
    if system_prompt is not None and not any(t["from"] == "system" for t in turns):
        turns = [{"from": "system", "value": system_prompt}] + turns
    ids: List[int] = []
    answer: List[bool] = []
    seen = seen_v = 0

    def put(xs, is_answer):
        ids.extend(xs)
        answer.extend([is_answer] * len(xs))

    for j, turn in enumerate(turns):
        role, value = turn["from"], turn["value"]
        head = ROLES[role] + "\n"
        put([special.im_start], False)
        if role == "gpt":
            if _PLACEHOLDER.search(value):
                raise SampleProblem("placeholder_mismatch", f"turn {j}: image/video placeholder in a gpt answer")
            xs, spans = tok.encode_offsets(head + value)
            ids.extend(xs)
            answer.extend(end > len(head) for _, end in spans)
            put([special.im_end], True)
        else:
            pending = ""   # text not yet encoded: a timestamp joins the text before it (one piece, as the
            for piece in _PLACEHOLDER.split(head + value):   # processor's tokenizer sees it)
                if piece == VIDEO:
                    if seen_v < len(videos):
                        for n, before in zip(*videos[seen_v]):
                            put(tok.encode(pending + before), False)
                            pending = ""
                            put([special.vision_start] + [special.video_pad] * int(n) + [special.vision_end], False)
                    seen_v += 1
                elif piece == IMAGE:
                    put(tok.encode(pending), False)
                    pending = ""
                    if seen < len(image_token_counts):
                        put([special.vision_start] + [special.image_pad] * int(image_token_counts[seen])
                            + [special.vision_end], False)
                    seen += 1
                else:
                    pending += piece
            put(tok.encode(pending), False)
            put([special.im_end], False)
        put(tok.encode("\n"), False)
    if seen != len(image_token_counts):
        raise SampleProblem("placeholder_mismatch",
                            f"{seen} {IMAGE} placeholder(s) but {len(image_token_counts)} image(s)")
    if seen_v != len(videos):
        raise SampleProblem("placeholder_mismatch", f"{seen_v} {VIDEO} placeholder(s) but {len(videos)} video(s)")
    if not any(t["from"] == "gpt" for t in turns):
        raise SampleProblem("no_answer", "no gpt turn (nothing to learn from)")
    return [np.asarray(ids, np.int64), np.asarray(answer, bool)]
