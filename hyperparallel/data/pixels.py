"""Image decoding with ``mindspore.dataset``: a prefetching pipeline, and the same ops eagerly.

A layout names its ops (a zero-argument factory of a list of ``mindspore.dataset`` ops or python
callables, applied in order to a file's bytes): ``merge_index`` uses :func:`transforms`,
``vision.Decode -> Resize((S, S)) -> Rescale(1/255) -> Normalize(mean, std) -> HWC2CHW`` (grey and
RGBA files decode to RGB); ``qwen_vl`` one python callable, transformers' image processor
(``hyperparallel/models/qwen_vl/image.py``, two outputs: pixel values and grid). A :class:`PixelStream`
runs the ops in a ``GeneratorDataset``/``map`` pipeline (``num_parallel_workers`` threads,
``prefetch`` rows buffered per stage) over the images of the micro-batches this process will
feed to the encoder, step after step, while the pipeline computes; a request outside that
stream (another step order, a recompute after the cache dropped it) is decoded eagerly with the
same ops, so the values never depend on which path served them.
"""
from __future__ import annotations

import atexit
import itertools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


def transforms(image_size: int, mean: Sequence[float], std: Sequence[float]) -> list:
    import mindspore.dataset.vision as V
    return [V.Decode(), V.Resize((int(image_size), int(image_size))), V.Rescale(1.0 / 255.0, 0.0),
            V.Normalize(list(mean), list(std)), V.HWC2CHW()]


def read_bytes(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8)


def decode_eager(path: str, ops: list):
    """One image file through the ops, in this thread (float32 array, or the tuple of arrays a
    several-output op returns); RuntimeError naming the file if it fails."""
    try:
        x = read_bytes(path)
        for op in ops:
            x = op(x)
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise RuntimeError(f"data: cannot decode image {path}: {_first_line(e)}") from None
    return tuple(x) if isinstance(x, tuple) else np.asarray(x, np.float32)


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not set(ln.strip()) <= set("-")]
    err = [ln for ln in lines if "[ERROR]" in ln]
    return (err or lines or [type(e).__name__])[0]


Key = Tuple[int, int]  # (step, global micro-batch)


class PixelStream:
    """Decoded images of (step, micro) for this process, in order, from a mindspore.dataset pipeline.

    ``files_of(step, micro)`` lists a micro-batch's image files (a pure function, cheap);
    ``make_ops()``: the ops (module docstring), ``outputs``: the names of their outputs;
    ``micros``: the global micro-batches of every step this process reads, in the order it
    reads them. The pipeline starts at the first step asked for."""

    def __init__(self, files_of: Callable[[int, int], List[str]], make_ops: Callable[[], list],
                 workers: int = 1, prefetch: int = 8, outputs: Sequence[str] = ("image",)):
        self.files_of, self.make_ops, self.outputs = files_of, make_ops, list(outputs)
        self.workers, self.prefetch = int(workers), int(prefetch)
        self.micros: List[int] = []
        self._ops = None
        self._it = None
        self._start: Optional[int] = None
        self._last: Optional[Key] = None          # the last (step, micro) the stream delivered
        self._buf: Dict[Key, List[np.ndarray]] = {}
        self._broken = False
        self.stats = {"stream": 0, "eager": 0}

    def plan(self, micros: Sequence[int]) -> None:
        """The global micro-batches of each step this process feeds to the encoder (a hint)."""
        new = sorted(set(int(m) for m in micros))
        if new != self.micros:
            self.reset()
            self.micros = new

    # -- the pipeline ---------------------------------------------------------------------
    def _rows(self, start: int):
        for step in itertools.count(start):
            for g in self.micros:
                for i, path in enumerate(self.files_of(step, g)):
                    yield read_bytes(path), np.asarray([step, g, i], np.int64)

    def _open(self, start: int) -> None:
        import mindspore.dataset as ds
        ds.config.set_prefetch_size(self.prefetch)
        data = ds.GeneratorDataset(lambda: self._rows(start), column_names=["image", "key"], shuffle=False)
        data = data.map(self.make_ops(), input_columns=["image"], output_columns=self.outputs,
                        num_parallel_workers=self.workers)
        self._it = data.create_tuple_iterator(output_numpy=True, num_epochs=1)
        self._start = start
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the pipeline; later requests are decoded eagerly."""
        self.reset()
        self._broken = True

    def reset(self) -> None:
        """Stop the pipeline and forget its position (the sample order changed); the next request
        starts a new one."""
        if self._it is not None:
            try:
                self._it.stop()
            except Exception:  # already stopped at interpreter exit
                pass
            self._it = None
        self._start = self._last = None
        self._buf.clear()

    def _order(self, key: Key) -> Tuple[int, int]:
        return key[0], self.micros.index(key[1])

    def get(self, step: int, micro: int) -> list:
        """The decoded images of micro-batch ``micro`` of ``step``, one entry per file (maybe none):
        a float32 array, or a tuple of arrays for several outputs."""
        key = (int(step), int(micro))
        files = self.files_of(*key)
        if not files:
            return []
        if key in self._buf and len(self._buf[key]) == len(files):
            return self._buf.pop(key)
        usable = (not self._broken and key[1] in self.micros and
                  (self._start is None or key[0] >= self._start) and
                  (self._last is None or self._order(key) > self._order(self._last)))
        if usable:
            if self._it is None:
                self._open(key[0])
            try:
                while len(self._buf.get(key, [])) < len(files):
                    *out, k = next(self._it)
                    got = (int(k[0]), int(k[1]))
                    self._buf.setdefault(got, []).append(np.asarray(out[0], np.float32) if len(out) == 1
                                                         else tuple(np.asarray(x) for x in out))
                    self._last = got
                for old in [k for k in self._buf if k[0] < key[0] - 1]:
                    del self._buf[old]   # stale: never asked for (a bounded buffer)
                self.stats["stream"] += 1
                return self._buf.pop(key)
            except (RuntimeError, StopIteration):
                self.close()   # find the failing file eagerly (names it), else continue eagerly
        if self._ops is None:
            self._ops = self.make_ops()
        self.stats["eager"] += 1
        return [decode_eager(p, self._ops) for p in files]
