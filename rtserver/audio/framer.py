"""Fixed-size audio frames from a stream of PCM chunks (sans-I/O).

A framer turns float32 mono samples, pushed in chunks of any size, into
encoded frames of exactly ``frame_samples`` samples each (PROTOCOL.md: every
frame of a context lasts ``frame_ms``; the last one is padded). Samples that
do not fill a frame are carried to the next ``push``; ``finish`` pads the
tail with silence. ``PcmS16Framer`` emits PCM s16le; ``OpusFramer``
(``rtserver.audio.opus``) emits Opus packets.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import FloatArray

# PROTOCOL.md, `start`: the frame durations and output rates a client may ask for.
FRAME_MS: tuple[int, ...] = (10, 20, 40, 60)
SAMPLE_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)

# Input PCM: any float dtype (converted to float32).
AnyFloatArray = npt.NDArray[np.floating[Any]]


class Framer(Protocol):
    """Float32 PCM in, whole encoded frames out.

    ``push`` returns the frames completed by these samples (possibly none);
    ``finish`` returns the rest, the last frame padded with silence, and
    ends the framer (a later ``push``/``finish`` raises ``RuntimeError``).
    ``pre_skip``: samples at 48 kHz a decoder drops from the start
    (RFC 7845); 0 for PCM.
    """

    @property
    def sample_rate(self) -> int: ...

    @property
    def frame_ms(self) -> int: ...

    @property
    def frame_samples(self) -> int: ...

    @property
    def pre_skip(self) -> int: ...

    @property
    def frames_out(self) -> int: ...

    def push(self, samples: AnyFloatArray) -> list[bytes]: ...

    def finish(self) -> list[bytes]: ...


def frame_samples_for(sample_rate: int, frame_ms: int) -> int:
    """Samples per frame; ``ValueError`` unless ``frame_ms`` is a protocol value
    and the frame holds a whole number of samples."""
    if frame_ms not in FRAME_MS:
        raise ValueError(f"frame_ms must be one of {FRAME_MS}, not {frame_ms}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, not {sample_rate}")
    if sample_rate * frame_ms % 1000:
        raise ValueError(f"{frame_ms} ms at {sample_rate} Hz is not a whole number of samples")
    return sample_rate * frame_ms // 1000


def as_mono_float32(samples: AnyFloatArray) -> FloatArray:
    """``samples`` as a 1-D float32 array; NaN becomes 0 and ±inf ±1 (a voice
    bug must not reach the encoder)."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono 1-D samples, got shape {x.shape}")
    if not np.isfinite(x).all():
        x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    return x


def float_to_s16le(samples: FloatArray) -> bytes:
    """[-1, 1) floats to little-endian int16, scaled by 32768 and clipped
    (the inverse of the client's ``/ 32768``)."""
    scaled = np.rint(samples * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype("<i2").tobytes()


class BlockFramer(ABC):
    """Frame bookkeeping shared by the framers: remainder, padding, counting.

    Subclasses implement ``_encode`` (one frame of exactly ``frame_samples``
    float32 samples to bytes) and may set ``_tail_samples``: silence appended
    by ``finish`` before padding (an encoder's lookahead).
    """

    def __init__(self, sample_rate: int, frame_ms: int) -> None:
        self._rate = sample_rate
        self._frame_ms = frame_ms
        self._n = frame_samples_for(sample_rate, frame_ms)
        self._rest = np.zeros(0, dtype=np.float32)
        self._frames_out = 0
        self._samples_in = 0
        self._finished = False
        self._tail_samples = 0

    @property
    def sample_rate(self) -> int:
        return self._rate

    @property
    def frame_ms(self) -> int:
        return self._frame_ms

    @property
    def frame_samples(self) -> int:
        return self._n

    @property
    def pre_skip(self) -> int:
        return 0

    @property
    def frames_out(self) -> int:
        return self._frames_out

    @property
    def samples_in(self) -> int:
        """Samples pushed so far (before padding)."""
        return self._samples_in

    @abstractmethod
    def _encode(self, frame: FloatArray) -> bytes:
        """One frame of ``frame_samples`` samples to its wire bytes."""

    def push(self, samples: AnyFloatArray) -> list[bytes]:
        if self._finished:
            raise RuntimeError("push after finish")
        x = as_mono_float32(samples)
        self._samples_in += len(x)
        if len(self._rest):
            x = np.concatenate([self._rest, x])
        whole = len(x) // self._n * self._n
        self._rest = x[whole:].copy()
        return self._encode_all(x[:whole])

    def finish(self) -> list[bytes]:
        """The remaining samples, then ``_tail_samples`` of silence, padded
        with silence to whole frames. Nothing pushed: no frames."""
        if self._finished:
            raise RuntimeError("finish called twice")
        self._finished = True
        if self._samples_in == 0:
            return []
        used = len(self._rest) + self._tail_samples
        total = math.ceil(used / self._n) * self._n
        x = np.zeros(total, dtype=np.float32)
        x[: len(self._rest)] = self._rest
        self._rest = np.zeros(0, dtype=np.float32)
        return self._encode_all(x)

    def _encode_all(self, x: FloatArray) -> list[bytes]:
        n = self._n
        frames = [self._encode(x[i:i + n]) for i in range(0, len(x), n)]
        self._frames_out += len(frames)
        return frames


class PcmS16Framer(BlockFramer):
    """Frames of PCM s16le (``frame_samples * 2`` bytes each).

    Any rate whose ``frame_ms`` frame holds whole samples is accepted; the
    protocol's rates (``SAMPLE_RATES``) all do.
    """

    def _encode(self, frame: FloatArray) -> bytes:
        return float_to_s16le(frame)


__all__ = [
    "FRAME_MS",
    "SAMPLE_RATES",
    "AnyFloatArray",
    "BlockFramer",
    "Framer",
    "PcmS16Framer",
    "as_mono_float32",
    "float_to_s16le",
    "frame_samples_for",
]
