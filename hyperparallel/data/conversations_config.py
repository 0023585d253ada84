"""The recipe ``data:`` section of ``type: conversations`` (keys and defaults: :mod:`.conversations`).

Some keys belong to one micro-batch layout only (:mod:`.formats`): ``image_size``, ``patch``,
``mean``, ``std``, ``shape_buckets`` to ``merge_index`` (fields here); a layout a model family registers
declares its own keys, with their defaults and checks (``Layout.keys``; their values are
``layout_keys`` and read as attributes). :meth:`ConversationsConfig.check_format` refuses a key the recipe
sets that the model's layout does not read.
"""
from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from .batch import PatchGeometry
from .config import DataSection
from .formats import LAYOUTS, layout_of, resolve_format
from .index import LINE_DEFAULT, LINE_FACTOR, LINE_SLACK
from .text import Tok
from ..errors import SpecError, is_whole, unknown_key, whole

DEMO_HINT = "for the demo set run: python tools/make_demo_data.py data/demo"
POLICIES = ("error", "skip")
SHAPE_BUCKETS = ("none", "pow2")   # data.shape_buckets (:func:`bucket`)


MAX_SEED = 2 ** 32 - 1   # numpy's and MindSpore's seeds are 32-bit
# integer keys and their bounds (far beyond real data sets; README "Bad input")
INT_BOUNDS = {"seq_len": 1 << 20, "micro_batch_size": 65_536, "image_size": 16_384, "patch": 16_384,
              "num_parallel_workers": 256, "prefetch": 4096}


def check_rgb(key: str, v, positive: bool = False) -> None:
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
class ConversationsConfig(DataSection, PatchGeometry):
    """Recipe ``data:`` section of ``type: conversations`` (see :mod:`.conversations`)."""

    type = "conversations"   # not a field: the registry key (hyperparallel.data.TYPES)
    checks_files = True

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
    shuffle: bool = True
    seed: Optional[int] = None
    num_parallel_workers: int = 1
    prefetch: int = 8
    on_bad_sample: str = "error"
    vocab: Optional[int] = None
    balance: str = "none"     # none | encoder (:mod:`.balance`)
    shape_buckets: str = "none"   # none | pow2 (:func:`bucket`; merge_index)
    packing: bool = False     # several samples per sequence (:mod:`.packing`); the model must take them
    micro_per_step: int = 1   # set from parallel_config (micro_batch_num x data_parallel), not a recipe key
    given: Tuple[str, ...] = ()   # the recipe keys the section sets, not a recipe key
    layout_keys: Dict[str, Any] = field(default_factory=dict)   # keys registered layouts declare, not a recipe key

    # the keys of every conversations section; each registered layout adds its own (:meth:`recipe_keys`)
    OWN_KEYS = ("type", "path", "tokenizer", "image_root", "seq_len", "micro_batch_size", "image_size", "patch",
                "mean", "std", "shuffle", "seed", "num_parallel_workers", "prefetch", "on_bad_sample", "vocab",
                "balance", "shape_buckets", "allow_outside_root", "max_line_bytes", "packing")

    @staticmethod
    def recipe_keys() -> Tuple[str, ...]:
        """The section's keys: its own, then those of every registered layout (:mod:`.formats`)."""
        out = list(ConversationsConfig.OWN_KEYS)
        out += [k for lay in LAYOUTS.values() for k in lay.keys if k not in out]
        return tuple(out)

    @staticmethod
    def defaults() -> Dict[str, Any]:
        """Every key's default: the fields', then the registered layouts' own keys'."""
        out = {f.name: (f.default if f.default is not MISSING else f.default_factory())
               for f in fields(ConversationsConfig)}
        for lay in LAYOUTS.values():
            out.update(lay.defaults())
        return out

    def __getattr__(self, name: str):
        """A key a registered layout declares reads as an attribute (``cfg.min_pixels``)."""
        keys = self.__dict__.get("layout_keys")
        if keys is not None and name in keys:
            return keys[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_recipe(cls, section: dict, raw: dict) -> "ConversationsConfig":
        """``micro_per_step`` from ``parallel_config`` (micro_batch_num x data_parallel)."""
        pc = raw.get("parallel_config") or {}
        try:
            mps = int(pc.get("micro_batch_num", 1)) * int(pc.get("data_parallel", 1) or 1)
        except (TypeError, ValueError):
            mps = 1
        return ConversationsConfig.from_section(section, max(1, mps))

    def check_model(self, model) -> None:
        try:
            self.check_format(model.data_format)
        except NotImplementedError as e:
            raise SpecError("model", str(e)) from None
        if self.packing:
            model.check_packing()   # the model reads packed sequences (its attention and positions per sample)

    def source(self, seed: int, data_format):
        """The source of the model's layout (the registry entry of its ``data_format()``)."""
        fmt = self.check_format(data_format)
        return layout_of(fmt).source(self, fmt, seed)

    @staticmethod
    def from_section(sec: dict, micro_per_step: int) -> "ConversationsConfig":
        sec = dict(sec or {})
        keys = ConversationsConfig.recipe_keys()
        bad = sorted(set(sec) - set(keys))
        if bad:
            raise unknown_key("data", sec, keys, "for data.type conversations")
        sec.pop("type", None)
        given = tuple(sec)   # in the recipe's order
        layout_keys: Dict[str, Any] = {}
        for lay in LAYOUTS.values():
            for k, v in lay.file_defaults(sec).items():
                if k in lay.keys:
                    sec.setdefault(k, v)   # the file's values are defaults: explicit keys win
            layout_keys.update(lay.defaults())
        own = {f.name for f in fields(ConversationsConfig)}
        layout_keys.update({k: sec.pop(k) for k in list(sec) if k not in own})
        cfg = ConversationsConfig(micro_per_step=int(micro_per_step), given=given, layout_keys=layout_keys, **sec)
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
        if not isinstance(self.packing, bool):
            raise SpecError("data.packing", f"true or false, got {self.packing!r}")
        if self.packing and self.balance != "none":
            raise SpecError("data.packing", f"true with data.balance {self.balance}: balancing regroups a step's "
                                            "samples into micro-batches of micro_batch_size samples, packing fills "
                                            "each sequence with as many as fit; set one of them off")
        if self.packing and self.shape_buckets != "none":
            raise SpecError("data.packing", f"true with data.shape_buckets {self.shape_buckets}: not done (the "
                                            "buckets pad merge_index micro-batches); set data.shape_buckets: none")
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
        check_rgb("mean", self.mean)
        check_rgb("std", self.std, positive=True)
        for lay in LAYOUTS.values():
            lay.validate(self)   # the keys a registered layout declares
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

    def check_format(self, data_format):
        """The model's layout (:func:`~.formats.resolve_format` of ``data_format``), after refusing a key
        the recipe sets that this layout does not read, and a ``preprocessor_config`` whose patch
        geometry is not the model's."""
        fmt = resolve_format(data_format)
        right = layout_of(fmt).keys
        wrong = {k for lay in LAYOUTS.values() if lay.name != fmt.name for k in lay.keys if k not in right}
        bad = [k for k in self.given if k in wrong]
        if bad:
            raise SpecError(f"data.{bad[0]}", f"does not apply to this model's {fmt.name} micro-batches "
                                              f"(its image keys: {', '.join(right)}); remove it")
        layout_of(fmt).check(self, fmt)
        return fmt

    def load_tokenizer(self) -> Tok:
        return Tok(self.tokenizer)

    def shapes(self) -> dict:
        """Model sizes implied by the data (merged into the model's config)."""
        vocab = int(self.vocab) if self.vocab is not None else self.load_tokenizer().vocab_size
        return {"vocab": vocab, "patch_dim": self.patch_dim, "num_patches": self.num_patches,
                "seq_len": self.seq_len}
