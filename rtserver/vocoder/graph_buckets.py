"""The batch sizes (windows a call) a decoder's CUDA graphs are captured for,
shared by ChatTTS's decoder and SNAC. Pure: no torch.

A call replays the smallest graph that holds its windows, so every row past
them is computed for nothing, and past a few windows a decoder call costs what
its rows cost (ChatTTS on an H200, bf16 graphs: 3.6 us a step at 8 x 101, 2.8
at 64 x 69, bench/results/h200-chattts-decode-2026-12-04; SNAC on an H100: 16
and 64 windows of 22 frames 12 and 48 ms, bench/results/h100-2026-12-06-s24).
Under load the calls hold 10-26 windows (ChatTTS at 512 streams on an H100,
bench/results/h100-2026-12-06-s23), where powers of two ran 17 windows on 32
rows and 9 on 16: ``BATCH_COUNTS`` steps by at most 1/4 past 8.
"""

from __future__ import annotations

from collections.abc import Sequence

BATCH_COUNTS: tuple[int, ...] = (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def batch_buckets(counts: Sequence[int], max_batch: int) -> list[int]:
    """The window counts graphs are captured for, ascending: ``counts`` below
    ``max_batch`` (empty: the powers of two) and ``max_batch`` itself, so every
    call of up to ``max_batch`` windows has one."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, not {max_batch}")
    given = counts or [1 << i for i in range(max_batch.bit_length())]
    return sorted({b for b in given if 1 <= b < max_batch} | {max_batch})


__all__ = ["BATCH_COUNTS", "batch_buckets"]
