"""LLaVA-style conversations with image files: the ``conversations`` data source.

Recipe::

    data:
      type: conversations
      path: data/demo/train.jsonl    # a JSON list or JSON lines of samples
      image_root: data/demo          # image file names are relative to it (default: path's folder)
      tokenizer: data/demo/tokenizer.json   # any Hugging Face tokenizers JSON file
      seq_len: 40                    # every sequence is padded to this length
      micro_batch_size: 2
      image_size: 8                  # images are resized to image_size x image_size
      patch: 4
      mean: [0.5, 0.5, 0.5]          # Normalize after Rescale(1/255)
      std: [0.5, 0.5, 0.5]
      shuffle: true
      seed: null                     # default: train.seed
      num_parallel_workers: 1        # mindspore.dataset decode threads
      prefetch: 8                    # rows buffered per pipeline stage
      on_bad_sample: error           # error | skip
      vocab: null                    # default: the tokenizer's vocabulary size

A sample: ``{"id": ..., "image": "a.png" | [...], "video": [frame files],
"conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", "value": "..."}]}``
(sequence rule: :mod:`.text`).

**The index.** Every rank reads the file, tokenizes every sample and checks that each
image file exists and has a valid image header (``PIL.Image.verify``; pixels are not
decoded). That gives the shape facts (images per sample, sequence lengths) of any
micro-batch without pixels. Samples with a problem stop the run (``on_bad_sample:
error``, naming file and line) or are left out (``skip``; counted, reported in the
metrics as ``data_skipped``).

**Order.** Global sample position ``p = base + (step * micro_per_step + micro) *
micro_batch_size + b`` (``micro_per_step`` = micro-batches of all data-parallel
groups); ``epoch, index = divmod(p, N)`` over the ``N`` usable samples, visited in a
permutation that is a pure function of (seed, epoch). ``position(step)`` is the
(epoch, index) where a step starts; ``seek(position, step)`` makes that step start
there (resume).

**Padding.** A sequence is its image and text tokens, then zero rows up to ``seq_len``
(no loss there); a sample longer than ``seq_len`` is a bad sample (never truncated).
A micro-batch without any image gets one all-zero filler image that no position reads
(the encoder's messages are never empty; the loss is unchanged).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .batch import MicroBatch, PatchGeometry, patchify
from .source import DataSource
from .text import Encoded, SampleProblem, Tok, encode_conversation, image_files
from ..mpipe.errors import SpecError

DEMO_HINT = "for the demo set run: python tools/make_demo_data.py data/demo"
POLICIES = ("error", "skip")


@dataclass(frozen=True)
class ConversationsConfig(PatchGeometry):
    """Recipe ``data:`` section of ``type: conversations`` (see module docstring)."""

    path: str = ""
    tokenizer: str = ""
    image_root: Optional[str] = None
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
    micro_per_step: int = 1   # set from parallel_config (micro_batch_num x data_parallel), not a recipe key

    RECIPE_KEYS = ("type", "path", "tokenizer", "image_root", "seq_len", "micro_batch_size", "image_size", "patch",
                   "mean", "std", "shuffle", "seed", "num_parallel_workers", "prefetch", "on_bad_sample", "vocab")

    @staticmethod
    def from_section(sec: dict, micro_per_step: int) -> "ConversationsConfig":
        sec = dict(sec or {})
        bad = sorted(set(sec) - set(ConversationsConfig.RECIPE_KEYS))
        if bad:
            raise SpecError(f"data.{bad[0]}", f"unknown key for data.type conversations "
                             f"(known: {', '.join(ConversationsConfig.RECIPE_KEYS)})")
        sec.pop("type", None)
        cfg = ConversationsConfig(micro_per_step=int(micro_per_step), **sec)
        cfg.validate()
        return cfg

    @property
    def root(self) -> str:
        return self.image_root if self.image_root is not None else os.path.dirname(self.path)

    def validate(self) -> None:
        for key in ("path", "tokenizer"):
            v = getattr(self, key)
            if not isinstance(v, str) or not v:
                raise SpecError(f"data.{key}", "required for data.type conversations")
            if not os.path.isfile(v):
                raise SpecError(f"data.{key}", f"file not found: {v} ({DEMO_HINT})")
        if not self.path.endswith((".json", ".jsonl")):
            raise SpecError("data.path", f"{self.path} must be a .json (list of samples) or .jsonl file")
        if not os.path.isdir(self.root):
            raise SpecError("data.image_root", f"folder not found: {self.root}")
        if self.on_bad_sample not in POLICIES:
            raise SpecError("data.on_bad_sample", f"{self.on_bad_sample!r} unknown (error, skip)")
        for k in ("seq_len", "micro_batch_size", "image_size", "patch", "num_parallel_workers", "prefetch"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise SpecError(f"data.{k}", "must be an integer >= 1")
        if self.image_size % self.patch:
            raise SpecError("data.patch", "must divide data.image_size")
        if self.channels != 3:
            raise SpecError("data.channels", "images are decoded to RGB (3)")
        for k in ("mean", "std"):
            v = getattr(self, k)
            if not isinstance(v, list) or len(v) != 3:
                raise SpecError(f"data.{k}", "a list of 3 numbers (R, G, B)")
        if any(float(s) <= 0 for s in self.std):
            raise SpecError("data.std", "must be > 0")
        if not isinstance(self.shuffle, bool):
            raise SpecError("data.shuffle", f"true or false, got {self.shuffle!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise SpecError("data.seed", f"an integer (or null: train.seed), got {self.seed!r}")
        size = self.load_tokenizer().vocab_size
        if self.vocab is not None and int(self.vocab) < size:
            raise SpecError("data.vocab", f"{self.vocab} is smaller than the vocabulary of the tokenizer "
                             f"{self.tokenizer} ({size} tokens); remove data.vocab or raise it to >= {size}")

    def load_tokenizer(self) -> Tok:
        return Tok(self.tokenizer)

    def shapes(self) -> dict:
        """Model sizes implied by the data (merged into the model's config)."""
        vocab = int(self.vocab) if self.vocab is not None else self.load_tokenizer().vocab_size
        return {"vocab": vocab, "patch_dim": self.patch_dim, "num_patches": self.num_patches,
                "seq_len": self.seq_len}


# -- the index -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    where: str               # "FILE:LINE" (jsonl) or "FILE sample N" (json list)
    id: str
    files: Tuple[str, ...]   # image files in encoder order (images, then video frames), absolute
    enc: Encoded


@dataclass(frozen=True)
class Problem:
    where: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.message}"


def read_records(path: str):
    """(where, record or None, problem or None) for every sample of a .json list or .jsonl file."""
    name = path
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{name}:{n}"
                try:
                    yield where, json.loads(line), None
                except json.JSONDecodeError as e:
                    yield where, None, Problem(where, "malformed_json", f"{e.msg} at column {e.pos + 1}")
        return
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise SpecError("data.path", f"{name}:{e.lineno}: malformed JSON ({e.msg}, column {e.colno}); "
                             "the whole file is unusable") from None
    if not isinstance(data, list):
        raise SpecError("data.path", f"{name}: expected a JSON list of samples")
    for i, rec in enumerate(data):
        yield f"{name} sample {i}", rec, None


def check_image(path: str) -> None:
    """Header check without decoding pixels: exists, and PIL recognises and verifies it."""
    if not os.path.isfile(path):
        raise SampleProblem("missing_image", f"image file not found: {path}")
    from PIL import Image
    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:
        raise SampleProblem("unreadable_image", f"not a readable image: {path} ({type(e).__name__}: {e})") from None


def parse_sample(where: str, rec, cfg: ConversationsConfig, tok: Tok, tokens_per_image: int,
                 check_files=check_image) -> Sample:
    if not isinstance(rec, dict):
        raise SampleProblem("bad_record", "a sample must be a JSON object")
    imgs, frames = image_files(rec)
    enc = encode_conversation(rec.get("conversations"), tok, len(imgs), len(frames), tokens_per_image)
    if enc.length > cfg.seq_len:
        raise SampleProblem("too_long", f"{enc.length} tokens (images expanded to {tokens_per_image} token(s) "
                                        f"each) > data.seq_len {cfg.seq_len}")
    files = tuple(os.path.abspath(os.path.join(cfg.root, f)) for f in imgs + frames)
    for p in files:
        check_files(p)
    return Sample(where, str(rec.get("id", where)), files, enc)


def build_index(cfg: ConversationsConfig, tokens_per_image: int, check_files=check_image):
    """(usable samples, problems) of the whole file, in file order."""
    tok = cfg.load_tokenizer()
    samples: List[Sample] = []
    problems: List[Problem] = []
    for where, rec, prob in read_records(cfg.path):
        if prob is not None:
            problems.append(prob)
            continue
        try:
            samples.append(parse_sample(where, rec, cfg, tok, tokens_per_image, check_files))
        except SampleProblem as e:
            sid = rec.get("id") if isinstance(rec, dict) else None
            problems.append(Problem(where + (f" (id {sid})" if sid is not None else ""), e.kind, str(e)))
    return samples, problems


def summary(problems: List[Problem]) -> str:
    c = Counter(p.kind for p in problems)
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items()))


# -- the whole data set, for data check and before launch ----------------------------------------

def scan(cfg: ConversationsConfig, tokens_per_image: int) -> Tuple[int, list, List[Problem]]:
    """(records read, usable samples, problems), decoding every image once."""
    from .pixels import decode_eager, transforms
    ops = transforms(cfg.image_size, cfg.mean, cfg.std)
    decoded = {}

    def check_and_decode(path: str) -> None:
        check_image(path)
        if path not in decoded:
            try:
                decode_eager(path, ops)
                decoded[path] = None
            except RuntimeError as e:
                decoded[path] = str(e)
        if decoded[path]:
            raise SampleProblem("undecodable_image", decoded[path].replace("data: ", "", 1))

    samples, problems = build_index(cfg, tokens_per_image, check_and_decode)
    return len(samples) + len(problems), samples, problems


# -- the source -------------------------------------------------------------------------------

class ConversationsSource(DataSource):
    """``micro_batch(step, micro)``: text, targets and shape facts from the index; pixels
    decoded (lazily, on first access) by a :class:`~.pixels.PixelStream`."""

    def __init__(self, cfg: ConversationsConfig, tokens_per_image: int, seed: int):
        self.cfg, self.k = cfg, int(tokens_per_image)
        self.seed = int(cfg.seed if cfg.seed is not None else seed)
        samples, problems = build_index(cfg, self.k)
        if problems and cfg.on_bad_sample == "error":
            raise SpecError("data", f"{len(problems)} bad sample(s) in {cfg.path} ({summary(problems)}); first: "
                             f"{problems[0]} (list all: hyperparallel data check RECIPE; or data.on_bad_sample=skip)")
        if not samples:
            raise SpecError("data.path", f"no usable sample in {cfg.path}")
        self.samples, self.problems = samples, problems
        self.skipped = len(problems)
        self.vocab = cfg.shapes()["vocab"]
        self.base = 0
        self._orders: Dict[int, np.ndarray] = {}
        self._meta: Dict[Tuple[int, int], MicroBatch] = {}
        from .pixels import PixelStream
        self.pixels = PixelStream(self.files_of, cfg.image_size, cfg.mean, cfg.std,
                                  cfg.num_parallel_workers, cfg.prefetch)

    # -- order and position ------------------------------------------------------------------
    @property
    def samples_per_step(self) -> int:
        return self.cfg.micro_per_step * self.cfg.micro_batch_size

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            n = len(self.samples)
            self._orders[epoch] = (np.random.default_rng([self.seed, int(epoch)]).permutation(n)
                                   if self.cfg.shuffle else np.arange(n))
        return self._orders[epoch]

    def sample_at(self, p: int) -> Sample:
        epoch, index = divmod(int(p), len(self.samples))
        return self.samples[int(self.order(epoch)[index])]

    def batch_samples(self, step: int, micro: int) -> List[Sample]:
        B = self.cfg.micro_batch_size
        p0 = self.base + (int(step) * self.cfg.micro_per_step + int(micro)) * B
        return [self.sample_at(p0 + b) for b in range(B)]

    def position(self, step: int) -> dict:
        """Where step ``step`` starts: {"epoch", "index", "num_samples"} (for a checkpoint)."""
        epoch, index = divmod(self.base + int(step) * self.samples_per_step, len(self.samples))
        return {"epoch": int(epoch), "index": int(index), "num_samples": len(self.samples)}

    def seek(self, position: dict, step: int) -> None:
        """Make step ``step`` start at ``position`` (a ``position()`` of this data set)."""
        n = int(position.get("num_samples", len(self.samples)))
        if n != len(self.samples):
            raise SpecError("data", f"the saved data position is for {n} usable samples, {self.cfg.path} has "
                             f"{len(self.samples)} now (data set or on_bad_sample changed)")
        self.base = int(position["epoch"]) * n + int(position["index"]) - int(step) * self.samples_per_step
        self._meta.clear()
        self.pixels.reset()   # a running pipeline read ahead in the old order

    # -- micro-batches ----------------------------------------------------------------------
    def files_of(self, step: int, micro: int) -> List[str]:
        return [f for s in self.batch_samples(step, micro) for f in s.files]

    def will_read_pixels(self, micros) -> None:
        """Hint: the global micro-batches of every step whose pixels this process reads."""
        self.pixels.plan(micros)

    def micro_batch(self, step: int, micro: int) -> MicroBatch:
        key = (int(step), int(micro))
        if key in self._meta:
            return self._meta[key]
        cfg, k, V, S = self.cfg, self.k, self.vocab, self.cfg.seq_len
        samples = self.batch_samples(*key)
        B = len(samples)
        counts = [len(s.files) for s in samples]
        extra = 0 if sum(counts) else 1
        rows_total = (sum(counts) + extra) * k
        merge = np.zeros((B, S), np.int32)
        onehot = np.zeros((B, S, V), np.float32)
        mask = np.zeros((B, S), np.float32)
        text, row_off, text_off = [], 0, 0
        for b, s in enumerate(samples):
            e = s.enc
            L = e.length
            img = e.layout < 0
            merge[b, :L] = np.where(img, 1 + row_off + (-1 - e.layout), 1 + rows_total + text_off + e.layout)
            tgt = np.nonzero(e.answer[1:])[0]               # positions t whose next token is an answer
            onehot[b, tgt, e.text[e.layout[tgt + 1]]] = 1.0
            mask[b, tgt] = 1.0
            text.append(e.text)
            row_off += len(s.files) * k
            text_off += len(e.text)
        mb = MicroBatch(text_ids=np.concatenate(text).astype(np.int32), merge_index=merge.reshape(-1),
                        onehot=onehot, mask=mask, images_per_sample=counts, extra_images=extra,
                        load=lambda: self.load_patches(*key), sample_ids=[s.id for s in samples])
        if len(self._meta) > 4 * max(1, cfg.micro_per_step):
            self._meta.clear()
        self._meta[key] = mb   # shared: pixels, once loaded, serve a repeated request
        return mb

    def load_patches(self, step: int, micro: int) -> np.ndarray:
        """(num_images, num_patches, patch_dim) float32 of one micro-batch (the filler is zeros)."""
        cfg = self.cfg
        imgs = self.pixels.get(step, micro)
        if imgs.shape[0] == 0:   # the filler image
            imgs = np.zeros((1, cfg.channels, cfg.image_size, cfg.image_size), np.float32)
        return np.stack([patchify(im, cfg.patch) for im in imgs]).astype(np.float32)

    @property
    def stats(self) -> dict:
        """Micro-batches whose pixels came from the prefetching pipeline / were decoded eagerly."""
        return dict(self.pixels.stats, skipped=self.skipped)

    def close(self) -> None:
        self.pixels.close()
