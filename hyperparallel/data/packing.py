"""Packed sequences (``data.packing: true``): several samples per sequence, up to ``data.seq_len`` tokens.

Every epoch's sample order (the same permutation as without packing, :meth:`~.indexed.IndexedSource.order`)
is packed greedily, first-fit, in that order: each sample goes into the first sequence of the epoch with
room for it, else opens a new one (:func:`first_fit`). The epoch's sequences keep the order in which they
were opened; a sequence never crosses an epoch. Step ``s``, global micro-batch ``g``, row ``b`` reads
sequence ``r = (s * micro_per_step + g) * micro_batch_size + b`` of that stream, so a micro-batch holds
``micro_batch_size`` sequences of one or more whole samples, and a step as many samples as fit. The packing
is a pure function of (seed, epoch, index): every rank packs alike without communication, and a
resumed run (the checkpoint's data position, ``{epoch, index}`` counting sequences, ``packed: true``)
reads the next sequences.

How a model reads a packed sequence is its adapter's (``ModelAdapter.check_packing``; the ``qwen_vl``
family: attention confined to each sample by a block-diagonal causal mask, M-RoPE positions restarting
per sample). The loss is the mean over the step's answer tokens as without packing
(``train.loss_normalization: tokens``): each micro-batch's answer tokens are those of its samples.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np


def first_fit(lengths: Sequence[int], capacity: int) -> List[List[int]]:
    """Indices into ``lengths``, packed first-fit in order into bins of ``capacity`` (each length
    ``<= capacity``): a bin per returned list, in the order bins were opened, each bin's items in order."""
    bins: List[List[int]] = []
    room = np.zeros(0, np.int64)
    for i, n in enumerate(lengths):
        n = int(n)
        if n > capacity:
            raise ValueError(f"a sample of {n} tokens does not fit data.seq_len {capacity}")
        fit = np.nonzero(room >= n)[0]
        if fit.size:
            k = int(fit[0])
            bins[k].append(i)
            room[k] -= n
        else:
            bins.append([i])
            room = np.append(room, capacity - n)
    return bins


class PackedRows:
    """The packed sequence stream of a source: ``rows(epoch)`` (sample indices per sequence) and the
    sequence at a global position counted from a base (epoch, index)."""

    def __init__(self, order, lengths: Sequence[int], capacity: int):
        self.order, self.lengths, self.capacity = order, np.asarray(lengths, np.int64), int(capacity)
        self._rows: Dict[int, List[List[int]]] = {}

    def rows(self, epoch: int) -> List[List[int]]:
        """The sequences of ``epoch``: lists of sample indices (into the source's samples)."""
        epoch = int(epoch)
        if epoch not in self._rows:
            if len(self._rows) > 4:
                self._rows.clear()
            order = self.order(epoch)
            self._rows[epoch] = [[int(order[i]) for i in b] for b in first_fit(self.lengths[order], self.capacity)]
        return self._rows[epoch]

    def locate(self, epoch: int, index: int, offset: int) -> Tuple[int, int]:
        """(epoch, index) of the sequence ``offset`` sequences after (epoch, index) (or before: negative)."""
        e, i = int(epoch), int(index) + int(offset)
        while i < 0:
            e -= 1
            if e < 0:
                raise ValueError(f"a packed sequence before the first one (epoch {epoch}, index {index}, "
                                 f"offset {offset})")
            i += len(self.rows(e))
        while i >= len(self.rows(e)):
            i -= len(self.rows(e))
            e += 1
        return e, i

    def row(self, epoch: int, index: int) -> List[int]:
        return self.rows(epoch)[index]
