"""The PCM chunk that flows from voices to the audio stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class PcmChunk:
    """Mono float32 samples in [-1, 1] at ``sample_rate`` Hz.

    A voice yields these in order; concatenated they are the segment's audio.
    """

    samples: FloatArray
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate
