"""Streaming sample-rate conversion of mono float32 PCM (libswresample, through
PyAV's filter graph: ``aresample``).

A voice's native rate (Piper 22050 Hz) to the rate the client asked for, or
the rate audio is encoded at. What matters here besides fidelity is how much
audio a resampler holds back until later input arrives: held audio is not
sent, so it cannot be heard. libsoxr (HQ), used before, held back 6-37 ms of
every chunk at 22050 -> 48000 Hz (its block buffering; it varied with the
chunk sizes), which cost the listener a start on Piper's first chunk.

Filter (measured on this machine, ``FILTER``): 64 taps per phase, cutoff 0.97
of the lower Nyquist, Kaiser beta 12. Flat to 0.9 of the lower Nyquist
(-0.12 dB there at 22050 -> 16000, 0.00 dB upsampling); aliasing of a tone in
the transition band at -120 dB; a sine comes out at 123-137 dB SNR (the
tests' bound is 110 dB); it holds back 1.4 ms (22050 -> 48000) to 2.1 ms
(22050 -> 16000); about 0.8 ms of CPU per second of audio. swresample's
default (16 taps, beta 9) aliases at -52 dB downsampling.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import av
import av.filter
import numpy as np

from rtserver.audio.framer import AnyFloatArray, as_mono_float32
from rtserver.audio.pcm import FloatArray

# aresample options (libswresample: filter_size is per phase, kaiser window)
FILTER = "filter_size=64:cutoff=0.97:kaiser_beta=12"


class Resampler:
    """``process`` chunks in order, then ``flush`` once for the held-back tail.

    Concatenated outputs equal a one-shot conversion of the concatenated
    inputs (bit for bit: the filter keeps its state), about
    ``n * out_rate / in_rate`` samples in all. Equal rates pass samples
    through unchanged. A call after ``flush`` raises ``RuntimeError``.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be > 0, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._graph: av.filter.Graph | None = None
        if in_rate != out_rate:
            graph = av.filter.Graph()
            source = graph.add_abuffer(format="flt", sample_rate=in_rate, layout="mono")
            convert = graph.add("aresample", f"{out_rate}:{FILTER}")
            sink = graph.add("abuffersink")
            source.link_to(convert)
            convert.link_to(sink)
            graph.configure()
            self._graph = graph
        self._time_base = Fraction(1, in_rate)
        self._pts = 0
        self._flushed = False

    @property
    def passthrough(self) -> bool:
        return self._graph is None

    def process(self, samples: AnyFloatArray) -> FloatArray:
        if self._flushed:
            raise RuntimeError("process after flush")
        x = as_mono_float32(samples)
        if self._graph is None:
            return x
        if len(x) == 0:  # an empty frame is an error in the graph
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x).reshape(1, -1),
                                           format="flt", layout="mono")
        frame.sample_rate = self.in_rate
        frame.time_base = self._time_base
        frame.pts = self._pts
        self._pts += len(x)
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> FloatArray:
        """The samples still held in the filter; ends the stream."""
        if self._flushed:
            raise RuntimeError("flush called twice")
        self._flushed = True
        if self._graph is None:
            return np.zeros(0, dtype=np.float32)
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> FloatArray:
        assert self._graph is not None
        parts: list[FloatArray] = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            parts.append(np.asarray(frame.to_ndarray(), dtype=np.float32).reshape(-1))
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@functools.lru_cache(maxsize=256)
def output_after_chunks(in_rate: int, out_rate: int,
                        chunk_samples: tuple[int, ...]) -> tuple[int, ...]:
    """Output samples a ``Resampler`` has returned after each input chunk,
    cumulative, for chunks of ``chunk_samples`` fed in order (no ``flush``).

    Exact: the hold-back depends on the chunk sizes, not on the samples, so
    the same sizes run through a fresh resampler of zeros. Cached: a
    streaming voice plans the same chunks for every segment. Equal rates
    return the inputs' running sums.
    """
    if any(n < 0 for n in chunk_samples):
        raise ValueError("chunk sizes must be >= 0")
    resampler = Resampler(in_rate, out_rate)
    out: list[int] = []
    total = 0
    for n in chunk_samples:
        total += len(resampler.process(np.zeros(n, dtype=np.float32)))
        out.append(total)
    return tuple(out)


__all__ = ["FILTER", "Resampler", "output_after_chunks"]
