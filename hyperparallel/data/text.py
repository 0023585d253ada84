"""Tokenizer loading and the conversation-to-sequence rule of the ``conversations`` source.

A tokenizer is any Hugging Face ``tokenizers`` JSON file (``Tokenizer.from_file``).
The rule that turns one LLaVA-style sample into a sequence (documented in docs/data.md):

* turns are laid out in order: a ``human`` turn as ``"USER: " + value``, a ``gpt`` turn
  as ``"ASSISTANT:"`` followed by ``" " + value`` and the tokenizer's end-of-sequence
  token (the first of ``EOS_CANDIDATES`` it knows; none if it knows none), a ``system``
  turn as ``"SYSTEM: " + value``;
* each ``<image>`` placeholder in a human or system turn becomes the next image's
  ``tokens_per_image`` encoder tokens (the model adapter says how many); a ``<video>``
  placeholder becomes every frame's tokens, frame after frame;
* the loss counts only positions whose next token belongs to a ``gpt`` turn's answer
  (its value and end-of-sequence token), never an image token or a prompt token.

Text pieces between placeholders are encoded separately without special tokens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
from ..errors import SpecError

IMAGE, VIDEO = "<image>", "<video>"
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|im_end|>", "<eos>", "[SEP]")
ROLES = {"human": "USER: ", "gpt": "ASSISTANT:", "system": "SYSTEM: "}
_PLACEHOLDER = re.compile(r"(<image>|<video>)")


class SampleProblem(ValueError):
    """A sample that cannot be used; ``kind`` groups the counts of ``data check``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Tok:
    """A loaded ``tokenizers`` file: ``encode(text)`` -> ids, ``vocab_size``, ``eos``."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer
        try:
            self.tk = Tokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception
            raise SpecError("data.tokenizer", f"cannot load {path} as a Hugging Face tokenizers JSON file "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        self.path = path
        self.vocab_size = vocab_size(self.tk)
        ids = [self.tk.token_to_id(t) for t in EOS_CANDIDATES]
        self.eos = next((i for i in ids if i is not None), None)

    def encode(self, text: str) -> List[int]:
        return list(self.tk.encode(text, add_special_tokens=False).ids) if text else []

    def encode_offsets(self, text: str) -> Tuple[List[int], List[Tuple[int, int]]]:
        """(ids, (start, end) character span of each id in ``text``)."""
        if not text:
            return [], []
        e = self.tk.encode(text, add_special_tokens=False)
        return list(e.ids), [tuple(o) for o in e.offsets]

    def token_id(self, token: str):
        """The id of ``token`` (e.g. a special token), None if the tokenizer lacks it."""
        return self.tk.token_to_id(token)


def vocab_size(tk) -> int:
    """Rows an embedding needs for every id of the ``tokenizers.Tokenizer`` ``tk``: its largest id + 1
    (``get_vocab_size`` counts tokens, fewer than that when the ids have gaps)."""
    ids = tk.get_vocab(with_added_tokens=True).values()
    return max(int(tk.get_vocab_size(with_added_tokens=True)), max(ids, default=-1) + 1)


@dataclass(frozen=True)
class Encoded:
    """One sample as a sequence: ``layout[t] >= 0`` is text token ``text[layout[t]]``,
    ``layout[t] = -1 - r`` is image-token row ``r`` of the sample; ``answer[t]`` marks answer tokens."""

    text: np.ndarray     # int32
    layout: np.ndarray   # int32
    answer: np.ndarray   # bool

    @property
    def length(self) -> int:
        return int(self.layout.shape[0])


def encode_conversation(turns, tok: Tok, n_images: int, frames: int, tokens_per_image: int) -> Encoded:
    """Lay out one sample's turns (see module docstring). ``n_images`` image files and
    ``frames`` video frames (0: no video) must match the placeholders exactly."""
    text: List[int] = []
    layout: List[int] = []
    answer: List[bool] = []
    rows = 0
    seen_img = seen_vid = 0

    def put_text(ids, is_answer):
        for i in ids:
            layout.append(len(text))
            text.append(i)
            answer.append(is_answer)

    def put_images(k):
        nonlocal rows
        for _ in range(k * tokens_per_image):
            layout.append(-1 - rows)
            rows += 1
            answer.append(False)

    if not isinstance(turns, list) or not turns:
        raise SampleProblem("bad_record", "'conversations' must be a non-empty list of turns")
    has_answer = False
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or turn.get("from") not in ROLES:
            raise SampleProblem("bad_record", f"turn {j}: expected {{\"from\": human|gpt|system, \"value\": str}}")
        role, value = turn["from"], turn["value"]
        if role == "gpt":
            if _PLACEHOLDER.search(value):
                raise SampleProblem("placeholder_mismatch", f"turn {j}: image/video placeholder in a gpt answer")
            put_text(tok.encode(ROLES[role]), False)
            ids = tok.encode(" " + value) + ([tok.eos] if tok.eos is not None else [])
            has_answer = has_answer or bool(ids)
            put_text(ids, True)
            continue
        for piece in _PLACEHOLDER.split(ROLES[role] + value):
            if piece == IMAGE:
                seen_img += 1
                if seen_img <= n_images:
                    put_images(1)
            elif piece == VIDEO:
                seen_vid += 1
                if seen_vid == 1:
                    put_images(frames)
            elif piece:
                put_text(tok.encode(piece), False)
    if seen_img != n_images:
        raise SampleProblem("placeholder_mismatch", f"{seen_img} {IMAGE} placeholder(s) but {n_images} image(s)")
    if seen_vid != (1 if frames else 0):
        raise SampleProblem("placeholder_mismatch",
                            f"{seen_vid} {VIDEO} placeholder(s) but {'a video' if frames else 'no video'}")
    if not has_answer:
        raise SampleProblem("no_answer", "no gpt answer tokens (nothing to learn from)")
    return Encoded(np.asarray(text, np.int32), np.asarray(layout, np.int32), np.asarray(answer, bool))


def image_files(record: dict) -> Tuple[List[str], List[str]]:
    """(image files, video frame files) of a record; SampleProblem if the fields are malformed."""
    img = record.get("image", [])
    imgs = [img] if isinstance(img, str) else img
    if not isinstance(imgs, list) or not all(isinstance(x, str) for x in imgs):
        raise SampleProblem("bad_record", "'image' must be a file name or a list of file names")
    vid = record.get("video", [])
    if isinstance(vid, str):
        raise SampleProblem("bad_record", f"'video' is one file ({vid!r}): give the video as a list of frame "
                                          "image files")
    if not isinstance(vid, list) or not all(isinstance(x, str) for x in vid):
        raise SampleProblem("bad_record", "'video' must be a list of frame image files")
    return list(imgs), list(vid)
