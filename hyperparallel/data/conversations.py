"""LLaVA-style conversations with image files: the ``conversations`` data source.

Recipe::

    data:
      type: conversations
      path: data/demo/train.jsonl    # a JSON list or JSON lines of samples
      image_root: data/demo          # image file names are relative to it (default: path's folder)
      allow_outside_root: false      # an image name resolving outside image_root (absolute, .., a symlink
                                     #   out) is an outside_image_root bad sample, never read; true: read it
      max_line_bytes: null           # a longer .jsonl line is line_too_long, never parsed (null: 64 x seq_len
                                     #   + 1 MiB)
      tokenizer: data/demo/tokenizer.json   # any Hugging Face tokenizers JSON file
      seq_len: 40                    # every sequence is padded to this length
      micro_batch_size: 2
      image_size: 8                  # merge_index: images are resized to image_size x image_size
      patch: 4                       # merge_index
      mean: [0.5, 0.5, 0.5]          # merge_index: Normalize after Rescale(1/255)
      std: [0.5, 0.5, 0.5]           # merge_index
      min_pixels: 3136               # qwen_vl: smart_resize's bounds on an image's area (56*56)
      max_pixels: 12845056           # qwen_vl (28*28*16384)
      image_mean: [0.48145466, 0.4578275, 0.40821073]   # qwen_vl (CLIP)
      image_std: [0.26862954, 0.26130258, 0.27577711]   # qwen_vl (CLIP)
      preprocessor_config: null      # qwen_vl: a Hugging Face preprocessor_config.json (its values
                                     #   are the defaults; explicit keys win)
      system_prompt: null            # qwen_vl: a system turn for samples without one
      shuffle: true
      seed: null                     # default: train.seed
      num_parallel_workers: 1        # mindspore.dataset decode threads
      prefetch: 8                    # rows buffered per pipeline stage
      on_bad_sample: error           # error | skip
      packing: false                 # true: several samples per sequence, first-fit (:mod:`.packing`; the
                                     #   model's adapter must take them: check_packing)
      vocab: null                    # default: the tokenizer's vocabulary size

A sample: ``{"id": ..., "image": "a.png" | [...], "video": [frame files],
"conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", "value": "..."}]}``
(sequence rule: :mod:`.text`).

**Layouts.** The model adapter's ``data_format()`` (:mod:`.formats`) picks the micro-batch:
``merge_index`` (:class:`~.batch.MicroBatch`, this module's source; turns as in :mod:`.text`,
images resized to ``image_size``) or a layout a model family registers (``qwen_vl``:
``hyperparallel/models/qwen_vl/``, Qwen's chat layout, each image's grid from its own size; video samples
are refused as ``unsupported_video``). A key of another layout that the recipe sets is refused
(:meth:`ConversationsConfig.check_format`).

**The index.** Every rank reads the file, tokenizes every sample and checks that each
image file exists and has a valid image header (``PIL.Image.verify``; pixels are not
decoded). That gives the shape facts (images per sample, sequence lengths, Qwen's image grids from the
header's size) of any micro-batch without pixels. Samples with a problem stop the run (``on_bad_sample:
error``, naming file and line) or are left out (``skip``; counted, reported in the
metrics as ``data_skipped``).

**Order.** Global sample position ``p = base + (step * micro_per_step + micro) *
micro_batch_size + b`` (``micro_per_step`` = micro-batches of all data-parallel
groups); ``epoch, index = divmod(p, N)`` over the ``N`` usable samples, visited in a
permutation that is a pure function of (seed, epoch). ``position(step)`` is the
(epoch, index) where a step starts; ``seek(position, step)`` makes that step start
there (resume).

**Padding.** A sequence is its image and text tokens, then padding up to ``seq_len`` (zero rows
for merge_index, ``<|endoftext|>`` for qwen_vl; no loss there); a sample longer than ``seq_len``
is a bad sample (never truncated). A micro-batch without any image gets one all-zero filler image
that no position reads (the encoder's messages are never empty; the loss is unchanged).

**Shape buckets** (``shape_buckets: pow2``, merge_index; default ``none``). A compiled chunk
(``mpipe.compile: jit``) compiles once per input shape, and conversations give a new image count
and text length almost every micro-batch. With ``pow2`` each micro-batch's image count is padded
up to a power of two with all-zero filler images, and its text ids up to a power of two with id 0,
both capped at the most the micro-batch can hold (``B * (seq_len // image_tokens)`` images,
``B * seq_len`` text ids). No position reads the padding: the loss and the gradients are those of
the unpadded micro-batch (the filler's encoder work is real compute), and the shapes the
encoder's first chunk and the LLM's first chunk see are bounded by ``log2`` of the caps.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from .batch import MicroBatch, patchify
from .conversations_config import DEMO_HINT, POLICIES, ConversationsConfig, bucket
from .formats import layout_of
from .index import Problem, Sample, check_image, read_records, summary
from .index import build_index as _build_index
from .indexed import IndexedSource
from .merge_layout import MergeLayout
from .text import SampleProblem
from ..errors import SpecError

# problems only a full decode finds: a run with on_bad_sample skip cannot leave their samples out
LATE_KINDS = ("undecodable_image", "grid_mismatch")


def layout_for(cfg: ConversationsConfig, data_format):
    """The index layout of the model's format (``data_format``: see :func:`~.formats.resolve_format`,
    or a layout this function made, returned as is), after :meth:`ConversationsConfig.check_format`."""
    if hasattr(data_format, "parse") and hasattr(data_format, "decode_check"):
        return data_format
    fmt = cfg.check_format(data_format)
    return layout_of(fmt).index(cfg, fmt, cfg.load_tokenizer())


def build_index(cfg: ConversationsConfig, data_format, check_files=check_image):
    """(usable samples, problems) of the whole file, in file order."""
    return _build_index(cfg, layout_for(cfg, data_format), check_files)


# -- the whole data set, for data check and before launch ----------------------------------------

def scan(cfg: ConversationsConfig, data_format) -> Tuple[int, list, List[Problem]]:
    """(records read, usable samples, problems), decoding every image once."""
    layout = layout_for(cfg, data_format)
    decoded = {}

    def check_and_decode(path: str):
        size = check_image(path)
        if path not in decoded:
            try:
                layout.decode_check(path)
                decoded[path] = None
            except SampleProblem as e:
                decoded[path] = e
        if decoded[path] is not None:
            raise decoded[path]
        return size

    samples, problems = _build_index(cfg, layout, check_and_decode)
    check = getattr(layout, "decode_sample", None)   # a layout whose samples hold more than image files
    if check is not None:                             # (qwen_vl: video files) decodes them here
        kept = []
        for s in samples:
            try:
                check(s)
                kept.append(s)
            except SampleProblem as e:
                problems.append(Problem(f"{s.where} (id {s.id})", e.kind, str(e)))
        samples = kept
    return len(samples) + len(problems), samples, problems


# -- the merge_index source ---------------------------------------------------------------------

class ConversationsSource(IndexedSource):
    """``micro_batch(step, micro)`` in the ``merge_index`` layout: text, targets and shape facts from
    the index; pixels decoded (lazily, on first access) by a :class:`~.pixels.PixelStream`.
    ``data_format``: a merge_index format (or its ``image_tokens`` as an int)."""

    def __init__(self, cfg: ConversationsConfig, data_format, seed: int):
        layout = layout_for(cfg, data_format)
        if not isinstance(layout, MergeLayout):
            raise TypeError("ConversationsSource lays out merge_index micro-batches; another layout has its own "
                            "source (data.formats.LAYOUTS)")
        if cfg.packing:
            raise SpecError("data.packing", "true: merge_index micro-batches are not packed (the models reading "
                                            "them attend across a whole sequence); set data.packing: false")
        super().__init__(cfg, layout, seed)
        self.k = layout.k
        self.vocab = cfg.shapes()["vocab"]
        self.filler_patches = cfg.num_patches
        from .pixels import PixelStream, transforms
        self.pixels = PixelStream(self.files_of, lambda: transforms(cfg.image_size, cfg.mean, cfg.std),
                                  cfg.num_parallel_workers, cfg.prefetch)

    def sample_patches(self, s) -> int:
        """Every image (and video frame) is resized to ``image_size``: ``num_patches`` patches each."""
        return len(s.files) * self.cfg.num_patches

    def encoder_patches(self, patches: int) -> int:
        """With ``shape_buckets: pow2`` the image count padded as :meth:`micro_batch` pads it."""
        cfg, n = self.cfg, int(patches) // self.cfg.num_patches
        if cfg.shape_buckets == "pow2":
            return bucket(n, cfg.micro_batch_size * (cfg.seq_len // self.k)) * cfg.num_patches
        return super().encoder_patches(patches)

    def micro_batch(self, step: int, micro: int) -> MicroBatch:
        key = (int(step), int(micro))
        return self.cached(key, lambda: self._make(key))

    def _make(self, key) -> MicroBatch:
        k, V, S = self.k, self.vocab, self.cfg.seq_len
        samples = self.batch_samples(*key)
        B = len(samples)
        counts = [len(s.files) for s in samples]
        T = sum(len(s.enc.text) for s in samples)
        # filler images (and with shape buckets text ids) that no position reads
        extra = self.encoder_patches(sum(counts) * self.cfg.num_patches) // self.cfg.num_patches - sum(counts)
        text_pad = bucket(T, B * S) - T if self.cfg.shape_buckets == "pow2" else 0
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
        text.append(np.zeros(text_pad, np.int32))
        return MicroBatch(text_ids=np.concatenate(text).astype(np.int32), merge_index=merge.reshape(-1),
                          onehot=onehot, mask=mask, images_per_sample=counts, extra_images=extra,
                          load=lambda: self.load_patches(*key, extra=extra), sample_ids=[s.id for s in samples])

    def load_patches(self, step: int, micro: int, extra: int) -> np.ndarray:
        """(num_images, num_patches, patch_dim) float32 of one micro-batch: its images, then its ``extra``
        filler images (zeros)."""
        cfg = self.cfg
        imgs = list(self.pixels.get(step, micro))
        imgs += [np.zeros((cfg.channels, cfg.image_size, cfg.image_size), np.float32)] * int(extra)
        return np.stack([patchify(im, cfg.patch) for im in imgs]).astype(np.float32)


__all__ = ["ConversationsConfig", "ConversationsSource", "DEMO_HINT", "POLICIES", "LATE_KINDS", "Problem",
           "Sample", "build_index", "check_image", "layout_for", "read_records", "scan", "summary"]
