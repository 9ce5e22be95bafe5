"""A context's frames as float32 PCM (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
OPUS_RATE = 48000  # `pre_skip` is counted at 48 kHz (PROTOCOL.md, `started`)


def decode_frames(frames: Sequence[bytes], *, format: str, sample_rate: int, frame_ms: int,
                  pre_skip: int = 0) -> FloatArray:
    """Mono float32 PCM of a context's frames, in order.

    Opus: one libopus decoder at the stream rate; the encoder delay
    (``pre_skip`` samples at 48 kHz) is dropped from the start. PCM s16le is
    scaled to [-1, 1). The last frame's padding is kept (PROTOCOL.md: every
    frame lasts ``frame_ms``).
    """
    if format == "pcm_s16le":
        joined = b"".join(frames)
        return (np.frombuffer(joined, dtype="<i2").astype(np.float32) / 32768.0)
    if format != "opus":
        raise ValueError(f"unknown audio format '{format}'")
    import opuslib

    decoder = opuslib.Decoder(sample_rate, 1)
    frame_size = sample_rate * frame_ms // 1000
    parts = [np.frombuffer(decoder.decode_float(packet, frame_size), dtype=np.float32)
             for packet in frames]
    pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    skip = round(pre_skip * sample_rate / OPUS_RATE)
    return pcm[skip:].astype(np.float32, copy=False)


__all__ = [
    "OPUS_RATE",
    "FloatArray",
    "decode_frames",
]
