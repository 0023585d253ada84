"""The recipe ``data:`` section of ``type: conversations`` (keys and defaults: :mod:`.conversations`).

Some keys belong to one micro-batch layout only (:mod:`.formats`): ``image_size``, ``patch``,
``mean``, ``std``, ``shape_buckets`` to ``merge_index``; ``min_pixels``, ``max_pixels``,
``image_mean``, ``image_std``, ``preprocessor_config``, ``system_prompt`` to ``qwen_vl``. :meth:`ConversationsConfig.check_format`
refuses a key the recipe sets that the model's layout does not read.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .batch import PatchGeometry
from .formats import QWEN_VL, resolve_format
from .index import LINE_DEFAULT, LINE_FACTOR, LINE_SLACK
from ..models.qwen_vl.image import CLIP_MEAN, CLIP_STD, MAX_PIXELS, MIN_PIXELS, check_geometry, read_preprocessor_config
from .text import IMAGE, VIDEO, Tok
from ..errors import SpecError, is_whole, unknown_key, whole

DEMO_HINT = "for the demo set run: python tools/make_demo_data.py data/demo"
POLICIES = ("error", "skip")
MERGE_ONLY = ("image_size", "patch", "mean", "std", "shape_buckets")
SHAPE_BUCKETS = ("none", "pow2")   # data.shape_buckets (:func:`bucket`)
QWEN_ONLY = ("min_pixels", "max_pixels", "image_mean", "image_std", "preprocessor_config", "system_prompt")


MAX_SEED = 2 ** 32 - 1   # numpy's and MindSpore's seeds are 32-bit
# integer keys and their bounds (far beyond real data sets; README "Bad input")
INT_BOUNDS = {"seq_len": 1 << 20, "micro_batch_size": 65_536, "image_size": 16_384, "patch": 16_384,
              "num_parallel_workers": 256, "prefetch": 4096}


def _check_rgb(key: str, v, positive: bool = False) -> None:
    if not isinstance(v, list) or len(v) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                         and math.isfinite(x) for x in v):
        raise SpecError(f"data.{key}", f"a list of 3 numbers (R, G, B), got {v!r}")
    if positive and any(float(s) <= 0 for s in v):
        raise SpecError(f"data.{key}", "must be > 0")


def bucket(n: int, cap: int) -> int:
    """``data.shape_buckets: pow2``: the smallest power of two >= ``n`` (and >= 1), at most ``cap`` (the
    largest size the data can reach), never below ``n``."""
    n = max(int(n), 1)
    return max(n, min(1 << (n - 1).bit_length(), int(cap)))


@dataclass(frozen=True)
class ConversationsConfig(PatchGeometry):
    """Recipe ``data:`` section of ``type: conversations`` (see :mod:`.conversations`)."""

    path: str = ""
    tokenizer: str = ""
    image_root: Optional[str] = None
    allow_outside_root: bool = False   # image names may leave image_root (absolute, .., symlinks out)
    max_line_bytes: Optional[int] = None   # a .jsonl line longer than this is not parsed (None: line_limit())
    seq_len: int = 32
    micro_batch_size: int = 2
    image_size: int = 8
    patch: int = 4
    channels: int = 3
    mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    image_mean: List[float] = field(default_factory=lambda: list(CLIP_MEAN))
    image_std: List[float] = field(default_factory=lambda: list(CLIP_STD))
    preprocessor_config: Optional[str] = None
    system_prompt: Optional[str] = None
    shuffle: bool = True
    seed: Optional[int] = None
    num_parallel_workers: int = 1
    prefetch: int = 8
    on_bad_sample: str = "error"
    vocab: Optional[int] = None
    balance: str = "none"     # none | encoder (:mod:`.balance`)
    shape_buckets: str = "none"   # none | pow2 (:func:`bucket`; merge_index)
    micro_per_step: int = 1   # set from parallel_config (micro_batch_num x data_parallel), not a recipe key
    given: Tuple[str, ...] = ()   # the recipe keys the section sets, not a recipe key

    RECIPE_KEYS = ("type", "path", "tokenizer", "image_root", "seq_len", "micro_batch_size", "image_size", "patch",
                   "mean", "std", "min_pixels", "max_pixels", "image_mean", "image_std", "preprocessor_config",
                   "system_prompt", "shuffle", "seed", "num_parallel_workers", "prefetch", "on_bad_sample", "vocab",
                   "balance", "shape_buckets", "allow_outside_root", "max_line_bytes")

    @staticmethod
    def from_section(sec: dict, micro_per_step: int) -> "ConversationsConfig":
        sec = dict(sec or {})
        bad = sorted(set(sec) - set(ConversationsConfig.RECIPE_KEYS))
        if bad:
            raise unknown_key("data", sec, ConversationsConfig.RECIPE_KEYS, "for data.type conversations")
        sec.pop("type", None)
        given = tuple(sec)   # in the recipe's order
        if sec.get("preprocessor_config") is not None:
            for k, v in read_preprocessor_config(sec["preprocessor_config"]).items():
                if k in QWEN_ONLY:
                    sec.setdefault(k, v)   # the file's values are defaults: explicit keys win
        cfg = ConversationsConfig(micro_per_step=int(micro_per_step), given=given, **sec)
        cfg.validate()
        return cfg

    def line_limit(self) -> int:
        """Bytes a sample's line may hold (``max_line_bytes``, default :data:`~.index.LINE_FACTOR` bytes per
        token of ``seq_len`` plus 1 MiB for image names and other fields): a token rarely takes more than a
        few bytes, so a longer line would be far past ``seq_len``; it is refused before it is parsed."""
        return int(self.max_line_bytes) if self.max_line_bytes is not None else LINE_FACTOR * self.seq_len + LINE_SLACK

    @property
    def root(self) -> str:
        return self.image_root if self.image_root is not None else os.path.dirname(self.path)

    def validate(self) -> None:
        for key in ("path", "tokenizer"):
            v = getattr(self, key)
            if not isinstance(v, str) or not v:
                raise SpecError(f"data.{key}", "required for data.type conversations")
            if os.path.isdir(v):
                raise SpecError(f"data.{key}", f"{v} is a directory; give the file")
            if not os.path.isfile(v):
                raise SpecError(f"data.{key}", f"file not found: {v} ({DEMO_HINT})")
        if not self.path.endswith((".json", ".jsonl")):
            raise SpecError("data.path", f"{self.path} must be a .json (list of samples) or .jsonl file")
        if self.image_root is not None and not isinstance(self.image_root, str):
            raise SpecError("data.image_root", f"must be a folder name, got {self.image_root!r}")
        if not os.path.isdir(self.root):
            raise SpecError("data.image_root", f"folder not found: {self.root}")
        if not isinstance(self.allow_outside_root, bool):
            raise SpecError("data.allow_outside_root", f"true or false, got {self.allow_outside_root!r}")
        from .balance import MODES
        if self.balance not in MODES:
            raise SpecError("data.balance", f"{self.balance!r} unknown; allowed: {', '.join(MODES)}")
        if self.shape_buckets not in SHAPE_BUCKETS:
            raise SpecError("data.shape_buckets", f"{self.shape_buckets!r} unknown; allowed: {', '.join(SHAPE_BUCKETS)}")
        if self.shape_buckets != "none" and self.balance != "none":
            raise SpecError("data.shape_buckets", f"{self.shape_buckets} with data.balance {self.balance}: balancing "
                                                  "evens the encoder's real work per owner, and the padding would "
                                                  "change it again per micro-batch; set one of them to none")
        if self.on_bad_sample not in POLICIES:
            raise SpecError("data.on_bad_sample", f"{self.on_bad_sample!r} unknown (error, skip)")
        for k, bound in INT_BOUNDS.items():
            v = getattr(self, k)
            whole(f"data.{k}", v)   # true is no 1
            if v > bound:
                raise SpecError(f"data.{k}", f"{v} is above the bound {bound:,}")
        if self.image_size % self.patch:
            raise SpecError("data.patch", "must divide data.image_size")
        if self.channels != 3:
            raise SpecError("data.channels", "images are decoded to RGB (3)")
        _check_rgb("mean", self.mean)
        _check_rgb("std", self.std, positive=True)
        self._validate_qwen()
        if not isinstance(self.shuffle, bool):
            raise SpecError("data.shuffle", f"true or false, got {self.shuffle!r}")
        if self.seed is not None and (not is_whole(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise SpecError("data.seed", f"an integer 0..{MAX_SEED} (or null: train.seed), got {self.seed!r}")
        if self.max_line_bytes is not None and (not is_whole(self.max_line_bytes) or self.max_line_bytes < 1):
            raise SpecError("data.max_line_bytes", f"an integer >= 1 (or null: {LINE_DEFAULT}), "
                                                   f"got {self.max_line_bytes!r}")
        if self.vocab is not None and (not is_whole(self.vocab) or self.vocab < 1):
            raise SpecError("data.vocab", f"must be an integer >= 1 (or null: the tokenizer's), got {self.vocab!r}")
        size = self.load_tokenizer().vocab_size
        if self.vocab is not None and int(self.vocab) < size:
            raise SpecError("data.vocab", f"{self.vocab} is smaller than the vocabulary of the tokenizer "
                             f"{self.tokenizer} ({size} tokens); remove data.vocab or raise it to >= {size}")

    def _validate_qwen(self) -> None:
        for k in ("min_pixels", "max_pixels"):
            whole(f"data.{k}", getattr(self, k))
        if self.min_pixels > self.max_pixels:
            raise SpecError("data.min_pixels", f"{self.min_pixels} > data.max_pixels {self.max_pixels}")
        _check_rgb("image_mean", self.image_mean)
        _check_rgb("image_std", self.image_std, positive=True)
        if self.system_prompt is not None:
            if not isinstance(self.system_prompt, str):
                raise SpecError("data.system_prompt", f"a string (or null: none), got {self.system_prompt!r}")
            if IMAGE in self.system_prompt or VIDEO in self.system_prompt:
                raise SpecError("data.system_prompt", f"no {IMAGE} or {VIDEO} placeholder here (a sample's "
                                                      "images go in its own turns)")

    def check_format(self, data_format):
        """The model's layout (:func:`~.formats.resolve_format` of ``data_format``), after refusing a key
        the recipe sets that this layout does not read, and a ``preprocessor_config`` whose patch
        geometry is not the model's."""
        fmt = resolve_format(data_format)
        qwen = fmt.name == QWEN_VL
        wrong, right = (MERGE_ONLY, QWEN_ONLY) if qwen else (QWEN_ONLY, MERGE_ONLY)
        bad = [k for k in self.given if k in wrong]
        if bad:
            raise SpecError(f"data.{bad[0]}", f"does not apply to this model's {fmt.name} micro-batches "
                                              f"(its image keys: {', '.join(right)}); remove it")
        if qwen and self.preprocessor_config is not None:
            check_geometry(self.preprocessor_config, fmt)
        return fmt

    def load_tokenizer(self) -> Tok:
        return Tok(self.tokenizer)

    def shapes(self) -> dict:
        """Model sizes implied by the data (merged into the model's config)."""
        vocab = int(self.vocab) if self.vocab is not None else self.load_tokenizer().vocab_size
        return {"vocab": vocab, "patch_dim": self.patch_dim, "num_patches": self.num_patches,
                "seq_len": self.seq_len}
