"""A vocabulary reordered so the ids a model may write come first (the "head").

A speech LLM such as Orpheus-3B writes only its audio tokens and an end token
(28,674 of 156,940 ids), yet a decode step computes logits for every id and
the sampler reads them all. With the head's ids renumbered ``0 .. K-1`` and
every other id after them (in their old order), the model needs logits for
the first K ids only (``engine/vllm_head.py``): the engine maps prompts and
stop ids into the new numbering and the sampled ids back.

Pure Python and numpy; the model side rebuilds the same order from
``ranges`` and ``size``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


def merge_ranges(ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted distinct ``ids`` as half-open runs ``(lo, hi)``."""
    runs: list[list[int]] = []
    for t in sorted(set(ids)):
        if runs and runs[-1][1] == t:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1])
    return tuple((lo, hi) for lo, hi in runs)


def vocab_order(ranges: Sequence[Sequence[int]], size: int) -> npt.NDArray[np.int64]:
    """New id -> old id: the ranges' ids in order, then every other id below
    ``size`` in its old order. Raises ``ValueError`` for overlapping ranges or
    ids outside ``[0, size)``."""
    head = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]) \
        if ranges else np.zeros(0, dtype=np.int64)
    if head.size and (head.min() < 0 or head.max() >= size):
        raise ValueError(f"head ids must lie in [0, {size})")
    if np.unique(head).size != head.size:
        raise ValueError("head ranges overlap")
    rest = np.ones(size, dtype=bool)
    rest[head] = False
    return np.concatenate([head, np.flatnonzero(rest)])


@dataclass(frozen=True)
class HeadVocab:
    """The renumbering: ``ranges`` of old ids take new ids ``0 .. head_size-1``
    in order; the model's vocabulary has ``size`` ids."""

    ranges: tuple[tuple[int, int], ...]
    size: int
    _head: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _inverse: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        order = vocab_order(self.ranges, self.size)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size, dtype=np.int64)
        # Python ints: from_model runs on every delta of every stream (a few
        # ids each), where indexing a tuple beats a round trip through numpy
        k = sum(hi - lo for lo, hi in self.ranges)
        object.__setattr__(self, "_head", tuple(int(t) for t in order[:k]))
        object.__setattr__(self, "_inverse", inverse)

    @classmethod
    def of(cls, ids: Iterable[int], size: int) -> HeadVocab:
        """The head of exactly ``ids`` (any order), in ascending old id order."""
        return cls(merge_ranges(ids), size)

    @property
    def head_size(self) -> int:
        return len(self._head)

    def to_model(self, ids: Sequence[int]) -> list[int]:
        """Old ids (a prompt, stop ids) in the model's numbering."""
        return [int(t) for t in self._inverse[np.asarray(ids, dtype=np.int64)]] if ids else []

    def from_model(self, ids: Sequence[int]) -> list[int]:
        """Ids the model wrote (each below ``head_size``) in the old numbering;
        ``ValueError`` for one outside the head."""
        head = self._head
        try:  # a negative id indexes past the end too: refused like one past K
            return [head[t] if t >= 0 else head[len(head)] for t in ids]
        except IndexError:
            raise ValueError(f"model wrote an id outside its head of {len(head)}: "
                             f"{list(ids)}") from None

    def in_head(self, old_id: int) -> bool:
        return any(lo <= old_id < hi for lo, hi in self.ranges)
