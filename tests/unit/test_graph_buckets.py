"""The window counts decoders capture CUDA graphs for (``vocoder.graph_buckets``):
pure arithmetic, no torch."""

from __future__ import annotations

import itertools

import pytest

from rtserver.vocoder.graph_buckets import BATCH_COUNTS, batch_buckets


def test_the_given_counts_up_to_max_batch_and_max_batch_itself() -> None:
    assert batch_buckets((1, 3, 6, 12), 8) == [1, 3, 6, 8]
    assert batch_buckets(BATCH_COUNTS, 64) == list(BATCH_COUNTS)
    assert batch_buckets((0, 5, 5, 2), 6) == [2, 5, 6]


def test_no_counts_are_the_powers_of_two_and_max_batch() -> None:
    assert batch_buckets((), 64) == [1, 2, 4, 8, 16, 32, 64]
    # off the powers: every call of up to max_batch windows still has a bucket
    assert batch_buckets((), 48) == [1, 2, 4, 8, 16, 32, 48]


def test_default_counts_step_by_at_most_a_quarter_past_eight() -> None:
    assert all(b - a <= max(2, a // 4) for a, b in itertools.pairwise(BATCH_COUNTS))


def test_a_max_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        batch_buckets((), 0)
