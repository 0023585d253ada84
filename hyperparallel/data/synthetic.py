"""Deterministic synthetic image-text data with a real learning signal.

Each sample has 0..k images (drawn from ``data.images_per_sample``, a list of
probabilities for 0, 1, 2, ... images) or, with probability ``data.video_prob``,
a video of ``data.video_frames`` frames. Every image shows one of
``num_classes`` noisy prototypes. The text is an arithmetic token sequence
``t[j+1] = (t[j] + key + 1) mod vocab`` whose stride ``key`` is the sum of the
sample's image classes (mod ``num_classes``; ``num_classes`` when it has no
image), so predicting the text needs the images: the loss falls as the LLM
learns the rule and the encoder learns to read the class.

A micro-batch is a pure function of ``(seed, step, micro)``: every rank
regenerates exactly the micro-batches it needs, and knows the number of images
(the shape of variable-size encoder messages) without communication. The
encoder only sees the real images of a micro-batch (no padding to the maximum
count); the LLM sequence has fixed length ``max_image_tokens + text_len``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import math

import numpy as np

from .batch import MicroBatch, PatchGeometry, patchify
from .config import DataSection
from .source import DataSource
from ..errors import SpecError, is_number, number, unknown_key, whole
from ..recipe.schema import SYNTHETIC_IMAGES


@dataclass(frozen=True)
class DataConfig(DataSection, PatchGeometry):
    """Recipe ``data:`` section of the synthetic source (``data.type: synthetic``, the default)."""

    type = "synthetic"   # not a field: the registry key (hyperparallel.data.TYPES)

    micro_batch_size: int = 2
    text_len: int = 8
    vocab: int = 32
    image_size: int = 8
    channels: int = 3
    patch: int = 4
    num_classes: int = 4
    noise: float = 0.3
    images_per_sample: List[float] = field(default_factory=lambda: list(SYNTHETIC_IMAGES["images_per_sample"]))
    video_prob: float = SYNTHETIC_IMAGES["video_prob"]
    video_frames: int = SYNTHETIC_IMAGES["video_frames"]
    balance: str = "none"   # data.balance: none only (the generator has no per-sample encoder work)

    @classmethod
    def from_recipe(cls, section: dict, raw: dict) -> "DataConfig":
        return DataConfig.from_section(section)

    def check_model(self, model) -> None:
        """The merge-index layout of the project's own models (or a user's adapter without image
        placeholders, which reads what the generator makes)."""
        try:
            fmt = model.data_format()
        except NotImplementedError:
            return
        if fmt.get("format") != "merge_index":
            raise SpecError("data.type", f"synthetic data cannot feed {model.family} (it reads {fmt.get('format')} "
                                         "micro-batches); use data.type: conversations")

    def source(self, seed: int, data_format=None) -> "SyntheticSource":
        return SyntheticSource(self, seed)

    @staticmethod
    def from_section(sec: dict) -> "DataConfig":
        known = tuple(DataConfig.__dataclass_fields__)   # declaration order, for the message
        if "packing" in (sec or {}):
            raise SpecError("data.packing", "packs the samples of a data set (data.type: conversations); the "
                                            "synthetic generator makes whole sequences of data.text_len tokens")
        bad = sorted(set(sec or {}) - set(known))
        if bad:
            raise unknown_key("data", sec, known)
        cfg = DataConfig(**(sec or {}))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        from .balance import MODES
        if self.balance not in MODES:
            raise SpecError("data.balance", f"{self.balance!r} unknown; allowed: {', '.join(MODES)}")
        if self.balance == "encoder":
            raise SpecError("data.balance", "encoder needs a data source with per-sample encoder work "
                                            "(data.type: conversations, whose index knows every sample's images); "
                                            "the synthetic generator draws each micro-batch's images from "
                                            "(seed, step, micro-batch), so it has none: give data.balance: none")
        for k in ("micro_batch_size", "text_len", "vocab", "image_size", "channels", "patch", "num_classes",
                  "video_frames"):
            v = getattr(self, k)
            whole(f"data.{k}", v)
            if v > 1 << 20:
                raise SpecError(f"data.{k}", f"{v} is above the bound {1 << 20:,}")
        for k in ("noise", "video_prob"):
            number(f"data.{k}", getattr(self, k))
        ps = self.images_per_sample
        if not isinstance(ps, list) or not ps or len(ps) > 64 or any(
                not is_number(x) or not math.isfinite(x) for x in ps):
            raise SpecError("data.images_per_sample", f"must be a list of probabilities summing to 1, got {ps!r}")
        p = np.asarray(self.images_per_sample, float)
        if p.ndim != 1 or len(p) < 1 or (p < 0).any() or abs(p.sum() - 1) > 1e-6:
            raise SpecError("data.images_per_sample", "must be a list of probabilities summing to 1")
        if self.image_size % self.patch:
            raise SpecError("data.patch", "must divide data.image_size")
        if not 0 <= self.video_prob <= 1:
            raise SpecError("data.video_prob", "must be in [0, 1]")
        if self.num_classes + 1 > self.vocab:
            raise SpecError("data.vocab", "must exceed data.num_classes")
        for k in ("micro_batch_size", "text_len", "video_frames", "num_classes"):
            if int(getattr(self, k)) < 1:
                raise SpecError(f"data.{k}", "must be >= 1")

    @property
    def max_images(self) -> int:
        return max(len(self.images_per_sample) - 1, self.video_frames if self.video_prob > 0 else 0)

    @property
    def seq_len(self) -> int:
        return self.max_images + self.text_len

    def shapes(self) -> dict:
        """Model sizes implied by the data (merged into ModelConfig)."""
        return {"vocab": self.vocab, "patch_dim": self.patch_dim,
                "num_patches": self.num_patches, "seq_len": self.seq_len}


def _prototypes(cfg: DataConfig, seed: int) -> np.ndarray:
    rng = np.random.default_rng([int(seed), 7777])
    return rng.standard_normal((cfg.num_classes, cfg.channels, cfg.image_size, cfg.image_size))


def make_micro_batch(cfg: DataConfig, seed: int, step: int, micro: int) -> MicroBatch:
    """The micro-batch ``micro`` (global index over data-parallel groups) of ``step``."""
    protos = _prototypes(cfg, seed)
    probs = np.asarray(cfg.images_per_sample, float)
    B, T, S, V = cfg.micro_batch_size, cfg.text_len, cfg.seq_len, cfg.vocab
    samples = []
    for b in range(B):
        rng = np.random.default_rng([int(seed), int(step), int(micro), b])
        if rng.random() < cfg.video_prob:
            classes = [int(rng.integers(cfg.num_classes))] * cfg.video_frames
            video = True
        else:
            n = int(rng.choice(len(probs), p=probs))
            classes = [int(c) for c in rng.integers(cfg.num_classes, size=n)]
            video = False
        imgs = []
        for f, c in enumerate(classes):
            base = np.roll(protos[c], f, axis=-1) if video else protos[c]
            imgs.append(base + cfg.noise * rng.standard_normal(base.shape))
        start = int(rng.integers(V))
        samples.append((classes, imgs, start))
    if sum(len(s[0]) for s in samples) == 0:
        # The encoder needs >= 1 image per micro-batch (zero-size tensors do not travel).
        rng = np.random.default_rng([int(seed), int(step), int(micro), 10_000])
        c = int(rng.integers(cfg.num_classes))
        samples[0] = ([c], [protos[c] + cfg.noise * rng.standard_normal(protos[c].shape)], samples[0][2])

    patches, text_ids = [], []
    merge = np.zeros((B, S), np.int32)
    onehot = np.zeros((B, S, V), np.float32)
    mask = np.zeros((B, S), np.float32)
    n_total = sum(len(s[0]) for s in samples)
    img_off = 0
    for b, (classes, imgs, start) in enumerate(samples):
        key = (sum(classes) % cfg.num_classes) if classes else cfg.num_classes
        toks = [(start + j * (key + 1)) % V for j in range(T)]
        text_ids.extend(toks)
        n = len(classes)
        merge[b, :n] = 1 + img_off + np.arange(n)
        merge[b, n:n + T] = 1 + n_total + b * T + np.arange(T)
        for j in range(T - 1):
            onehot[b, n + j, toks[j + 1]] = 1.0
            mask[b, n + j] = 1.0
        patches.extend(patchify(im, cfg.patch) for im in imgs)
        img_off += n
    return MicroBatch(patches=np.stack(patches).astype(np.float32),
                      text_ids=np.asarray(text_ids, np.int32),
                      merge_index=merge.reshape(-1),
                      onehot=onehot, mask=mask,
                      images_per_sample=[len(s[0]) for s in samples])


class SyntheticSource(DataSource):
    """The synthetic generator as a data source: ``micro_batch(step, micro)`` for the global
    micro-batch index ``micro`` (over data-parallel groups) of optimizer step ``step``.
    Generation is cheap and a pure function of (seed, step, micro), so the data position is the
    step (the contract's defaults)."""

    def __init__(self, cfg: DataConfig, seed: int):
        self.cfg, self.seed = cfg, int(seed)

    def micro_batch(self, step: int, micro: int) -> MicroBatch:
        return make_micro_batch(self.cfg, self.seed, step, micro)

    def loss_tokens(self, step: int, micro: int) -> int:
        """Every sample's text has ``text_len - 1`` targets (without generating the micro-batch)."""
        return self.cfg.micro_batch_size * (self.cfg.text_len - 1)
