"""Streaming sample-rate conversion of mono float32 PCM (libsoxr via ``soxr``).

A voice's native rate (Piper 22050 Hz, SNAC 24000 Hz) to the rate the client
asked for. Quality "HQ" (soxr's 20-bit recipe): beyond what s16 PCM or Opus
can carry, for under 1 ms of CPU per second of audio (0.25-0.8 ms measured at
22050 -> 48000 on a 2-core x86 machine). "VHQ" costs 15 % more for nothing
audible here, and holds back up to twice as much audio when downsampling
(measured 50-84 ms vs 22-40 ms at 22050 -> 16000). soxr holds back a few to
about 40 ms of output until later input (or ``flush``) arrives: the filter's
lookahead plus its block buffering.
"""

from __future__ import annotations

import functools

import numpy as np
import soxr

from rtserver.audio.framer import AnyFloatArray, as_mono_float32
from rtserver.audio.pcm import FloatArray

QUALITIES = ("QQ", "LQ", "MQ", "HQ", "VHQ")


class Resampler:
    """``process`` chunks in order, then ``flush`` once for the held-back tail.

    Concatenated outputs equal a one-shot conversion of the concatenated
    inputs, about ``n * out_rate / in_rate`` samples in all. Equal rates pass
    samples through unchanged. A call after ``flush`` raises ``RuntimeError``.
    """

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be > 0, got {in_rate} -> {out_rate}")
        if quality not in QUALITIES:
            raise ValueError(f"quality must be one of {QUALITIES}, not {quality!r}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (None if in_rate == out_rate else
                        soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32",
                                            quality=quality))
        self._flushed = False

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, samples: AnyFloatArray) -> FloatArray:
        if self._flushed:
            raise RuntimeError("process after flush")
        x = as_mono_float32(samples)
        if self._stream is None:
            return x
        return np.asarray(self._stream.resample_chunk(x, last=False), dtype=np.float32)

    def flush(self) -> FloatArray:
        """The samples still held in the filter; ends the stream."""
        if self._flushed:
            raise RuntimeError("flush called twice")
        self._flushed = True
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return np.asarray(tail, dtype=np.float32)


@functools.lru_cache(maxsize=256)
def output_after_chunks(in_rate: int, out_rate: int, chunk_samples: tuple[int, ...],
                        quality: str = "HQ") -> tuple[int, ...]:
    """Output samples a ``Resampler`` has returned after each input chunk,
    cumulative, for chunks of ``chunk_samples`` fed in order (no ``flush``).

    soxr's hold-back depends on the chunk sizes, not on the samples (it is
    its filter's lookahead plus its block buffering: 6-37 ms at 22050 ->
    48000 Hz HQ, varying from chunk to chunk), so this is exact: the same
    sizes run through a fresh stream of zeros. Cached: a streaming voice plans
    the same chunks for every segment. Equal rates return the inputs' sums.
    """
    if any(n < 0 for n in chunk_samples):
        raise ValueError("chunk sizes must be >= 0")
    resampler = Resampler(in_rate, out_rate, quality=quality)
    out: list[int] = []
    total = 0
    for n in chunk_samples:
        total += len(resampler.process(np.zeros(n, dtype=np.float32)))
        out.append(total)
    return tuple(out)


__all__ = ["QUALITIES", "Resampler", "output_after_chunks"]
