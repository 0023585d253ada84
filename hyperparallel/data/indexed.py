"""What both conversations sources share: the index, the bad-sample policy, the sample order,
the data position and seek (rules: :mod:`.conversations`, "Order"), the answer-token counts
(``train.loss_normalization: tokens``) and the per-step sample assignment (``data.balance: encoder``,
:mod:`.balance`)."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .balance import assign
from .index import Sample, build_index, summary
from .packing import PackedRows
from .source import DataSource
from ..errors import SpecError


class IndexedSource(DataSource):
    """Samples of ``layout`` (its index built here) in a per-epoch order; a subclass sets ``pixels``
    (a :class:`~.pixels.PixelStream`) and makes the micro-batches."""

    pixels = None
    has_encoder_work = True

    def __init__(self, cfg, layout, seed: int):
        self.cfg, self.layout = cfg, layout
        self.seed = int(cfg.seed if cfg.seed is not None else seed)
        samples, problems = build_index(cfg, layout)
        if problems and cfg.on_bad_sample == "error":
            raise SpecError("data", f"{len(problems)} bad sample(s) in {cfg.path} ({summary(problems)}); first: "
                             f"{problems[0]} (list all: hyperparallel data check RECIPE; or data.on_bad_sample=skip)")
        if not samples:
            raise SpecError("data.path", f"no usable sample in {cfg.path}")
        self.samples, self.problems = samples, problems
        self.skipped = len(problems)
        self.base = 0
        self._orders: Dict[int, np.ndarray] = {}
        self._meta: Dict = {}
        self.owners = None            # owner of each global micro-batch (balance_by), None: position order
        self._groups: Dict[int, List[List[int]]] = {}
        # data.packing: several samples per sequence (:mod:`.packing`); pbase: (epoch, index, step) where the
        # sequence stream of step ``step`` starts
        self.packed = bool(getattr(cfg, "packing", False))
        self.packs = PackedRows(self.order, [s.enc.length for s in samples], cfg.seq_len) if self.packed else None
        self.pbase = (0, 0, 0)

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

    def batch_rows(self, step: int, micro: int) -> List[List[Sample]]:
        """The sequences of global micro-batch ``micro`` of ``step``, each a list of samples: one sample each
        (:meth:`batch_samples`), or with ``data.packing`` the step's packed sequences
        ``micro*B .. micro*B + B - 1`` (:mod:`.packing`)."""
        if not self.packed:
            return [[s] for s in self.batch_samples(step, micro)]
        B = self.cfg.micro_batch_size
        e0, i0, s0 = self.pbase
        first = (int(step) - s0) * self.samples_per_step + int(micro) * B
        out = []
        for b in range(B):
            e, i = self.packs.locate(e0, i0, first + b)
            out.append([self.samples[k] for k in self.packs.row(e, i)])
        return out

    def batch_samples(self, step: int, micro: int) -> List[Sample]:
        """The samples of global micro-batch ``micro`` of ``step``: positions ``micro*B .. micro*B + B - 1``
        of the step, or with :meth:`balance_by` the step's samples assigned to it (:func:`.balance.assign`);
        with ``data.packing`` those of its sequences, in sequence order (:meth:`batch_rows`)."""
        if self.packed:
            return [s for row in self.batch_rows(step, micro) for s in row]
        B = self.cfg.micro_batch_size
        p0 = self.base + int(step) * self.samples_per_step
        idx = range(int(micro) * B, (int(micro) + 1) * B) if self.owners is None else self.groups(step)[int(micro)]
        return [self.sample_at(p0 + i) for i in idx]

    def loss_tokens(self, step: int, micro: int) -> int:
        return sum(s.loss_tokens for s in self.batch_samples(step, micro))

    def step_counts(self, step: int) -> dict:
        """The samples of step ``step`` and their tokens (every position that is not padding), from the index:
        what ``metrics.jsonl`` reports as ``samples`` and ``real_tokens`` (packing holds more of both)."""
        samples = self.step_samples(step)
        return {"samples": len(samples), "real_tokens": int(sum(s.enc.length for s in samples))}

    # -- per-step sample assignment (data.balance: encoder) ------------------------------------
    def sample_patches(self, s: Sample) -> int:
        """Encoder patches of one sample (its encoder work); the subclass knows its layout."""
        raise NotImplementedError

    #: encoder patches of the filler image of a micro-batch without images (set by the subclass)
    filler_patches = 0

    def encoder_patches(self, patches: int) -> int:
        """Patches the encoder runs for a micro-batch whose samples hold ``patches``: at least the
        filler image's (a subclass that pads micro-batches says how)."""
        return max(self.filler_patches, int(patches))

    def step_samples(self, step: int) -> List[Sample]:
        if self.packed:
            return [s for g in range(self.cfg.micro_per_step) for s in self.batch_samples(step, g)]
        p0 = self.base + int(step) * self.samples_per_step
        return [self.sample_at(p0 + i) for i in range(self.samples_per_step)]

    def encoder_work(self, step: int) -> List[int]:
        """Encoder patches of each sample of step ``step``, in position order (from the index)."""
        return [self.sample_patches(s) for s in self.step_samples(step)]

    def mean_patches(self) -> float:
        """Mean encoder patches of a sample over the usable samples."""
        return float(np.mean([self.sample_patches(s) for s in self.samples]))

    def balance_by(self, owners) -> None:
        """Assign every step's samples to micro-batches by encoder work; ``owners[g]``: the owner rank of
        global micro-batch ``g`` (its encoder forward's rank)."""
        if len(owners) != self.cfg.micro_per_step:
            raise ValueError(f"{len(owners)} owners for {self.cfg.micro_per_step} micro-batches per step")
        self.owners = list(owners)
        self._groups.clear()
        self._meta.clear()

    def groups(self, step: int) -> List[List[int]]:
        """Step ``step``'s sample indices (into :meth:`step_samples`) of every global micro-batch."""
        step = int(step)
        if step not in self._groups:
            if len(self._groups) > 8:
                self._groups.clear()
            self._groups[step] = assign(self.encoder_work(step), self.cfg.micro_batch_size, self.owners)
        return self._groups[step]

    def position(self, step: int) -> dict:
        """Where step ``step`` starts: {"epoch", "index", "num_samples"} (for a checkpoint); with
        ``data.packing`` ``index`` counts the epoch's packed sequences, and ``packed`` is true."""
        if self.packed:
            e0, i0, s0 = self.pbase
            epoch, index = self.packs.locate(e0, i0, (int(step) - s0) * self.samples_per_step)
            return {"epoch": int(epoch), "index": int(index), "num_samples": len(self.samples), "packed": True}
        epoch, index = divmod(self.base + int(step) * self.samples_per_step, len(self.samples))
        return {"epoch": int(epoch), "index": int(index), "num_samples": len(self.samples)}

    def seek(self, position: dict, step: int) -> None:
        """Make step ``step`` start at ``position`` (a ``position()`` of this data set)."""
        n = int(position.get("num_samples", len(self.samples)))
        if n != len(self.samples):
            raise SpecError("data", f"the saved data position is for {n} usable samples, {self.cfg.path} has "
                             f"{len(self.samples)} now (data set or on_bad_sample changed)")
        if bool(position.get("packed", False)) != self.packed:
            raise SpecError("data.packing", f"the saved data position is {'with' if position.get('packed') else 'without'}"
                                            f" packing, this run is {'with' if self.packed else 'without'}; resume "
                                            "with the data.packing the checkpoint was saved with")
        if self.packed:
            epoch, index = int(position["epoch"]), int(position["index"])
            if not 0 <= index < len(self.packs.rows(epoch)):
                raise SpecError("data", f"the saved data position {position} is past the {len(self.packs.rows(epoch))}"
                                        f" packed sequences of epoch {epoch} (data.seq_len or the data set changed)")
            self.pbase = (epoch, index, int(step))
        self.base = int(position["epoch"]) * n + int(position["index"]) - int(step) * self.samples_per_step
        self._meta.clear()
        self._groups.clear()
        self.pixels.reset()   # a running pipeline read ahead in the old order

    # -- micro-batches ----------------------------------------------------------------------
    def files_of(self, step: int, micro: int) -> List[str]:
        return [f for s in self.batch_samples(step, micro) for f in s.files]

    def will_read_pixels(self, micros) -> None:
        """Hint: the global micro-batches of every step whose pixels this process reads."""
        self.pixels.plan(micros)

    def cached(self, key, make):
        """The micro-batch of ``key`` = (step, micro), made once by ``make()`` and shared (pixels, once
        loaded, serve a repeated request); a bounded cache."""
        if key not in self._meta:
            if len(self._meta) > 4 * max(1, self.cfg.micro_per_step):
                self._meta.clear()
            self._meta[key] = make()
        return self._meta[key]

    @property
    def stats(self) -> dict:
        """Micro-batches whose pixels came from the prefetching pipeline / were decoded eagerly."""
        return dict(self.pixels.stats, skipped=self.skipped)

    def close(self) -> None:
        self.pixels.close()
