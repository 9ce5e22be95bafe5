"""Graph families get capture streams of their own (``rtserver.engine.capture_streams``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from rtserver.engine.capture_streams import CaptureStreams


@dataclass
class _Stream:
    cuda_stream: int


def _pool(size: int) -> CaptureStreams:
    """Like ``torch.cuda.Stream()``: raw streams handed out round-robin from a pool."""
    raw = itertools.cycle(range(1000, 1000 + size))
    return CaptureStreams(lambda: _Stream(next(raw)))


def test_each_family_gets_a_raw_stream_no_other_has() -> None:
    streams = _pool(32)
    got = [streams.new().cuda_stream for _ in range(32)]
    assert len(set(got)) == 32


def test_streams_drawn_in_between_do_not_make_a_repeat() -> None:
    """Other code (warm-up side streams) draws from the same pool meanwhile:
    a family still never gets a stream an earlier family captured on."""
    raw = itertools.cycle(range(4))
    streams = CaptureStreams(lambda: _Stream(next(raw)))
    first = streams.new().cuda_stream
    for _ in range(3):  # three side streams: the pool is back at ``first``
        next(raw)
    assert streams.new().cuda_stream != first


def test_an_exhausted_pool_is_an_error_not_a_shared_stream() -> None:
    streams = _pool(2)
    streams.new()
    streams.new()
    with pytest.raises(RuntimeError, match="no CUDA stream left"):
        streams.new()
