"""What both conversations sources share: the index, the bad-sample policy, the sample order,
the data position and seek (rules: :mod:`.conversations`, "Order")."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .index import Sample, build_index, summary
from .source import DataSource
from ..mpipe.errors import SpecError


class IndexedSource(DataSource):
    """Samples of ``layout`` (its index built here) in a per-epoch order; a subclass sets ``pixels``
    (a :class:`~.pixels.PixelStream`) and makes the micro-batches."""

    pixels = None

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
