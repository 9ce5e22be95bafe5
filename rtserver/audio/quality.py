"""Objective speech quality: wide-band PESQ (ITU-T P.862.2) of a degraded
signal against its reference, when the optional ``pesq`` package is there."""

from __future__ import annotations

import numpy as np

from rtserver.audio.pcm import FloatArray
from rtserver.audio.resample import Resampler


def pesq_wb(ref: FloatArray, out: FloatArray, rate: int) -> float | None:
    """Wide-band PESQ (1-4.64) of ``out`` against ``ref``, both at ``rate`` Hz
    (resampled to PESQ's 16 kHz); None without the ``pesq`` package."""
    try:
        from pesq import pesq
    except ImportError:
        return None
    to16 = (lambda a: a) if rate == 16000 else (
        lambda a: np.asarray(Resampler(rate, 16000).process(a), dtype=np.float32))
    a, b = to16(ref), to16(out)
    n = min(len(a), len(b))
    return float(pesq(16000, a[:n], b[:n], "wb"))
