"""The PCM chunk that flows from voices to the audio stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class WordTime:
    """When one word of a segment is heard, as the voice's model timed it:
    ``text[start_char:end_char]`` of the segment's text, from ``start_s`` to
    ``end_s`` seconds after the segment's first sample."""

    start_char: int
    end_char: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class PcmChunk:
    """Mono float32 samples in [-1, 1] at ``sample_rate`` Hz.

    A voice yields these in order; concatenated they are the segment's audio.
    ``words``: a voice that times words itself (``VoiceInfo.word_timing``
    "model") puts on a chunk the words whose audio starts in it or later
    and was not given on an earlier chunk (Piper: each sentence's words on
    its first chunk).
    """

    samples: FloatArray
    sample_rate: int
    words: tuple[WordTime, ...] = ()

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate
