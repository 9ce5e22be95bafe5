"""A toy voice family: ``toy:<speaker>`` speaks a sine tone per character.

It uses only rtserver's public seams (``VoiceFamily``, ``Voice``, its
``[toy]`` config section) so that a test can install it as its own
distribution and serve it from an unmodified rtserver.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rtserver.audio.pcm import PcmChunk
from rtserver.errors import UnknownVoice
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings

RATE = 16000
MS_PER_CHAR = 20.0


@dataclass(frozen=True, slots=True)
class ToySection:
    """``[toy]``: the tone's pitch (``RTSERVER_TOY_PITCH_HZ`` or a config file)."""

    pitch_hz: float = 440.0

    def check(self) -> None:
        if not 50 <= self.pitch_hz <= 4000:
            raise ValueError(f"pitch_hz must be in 50..4000, not {self.pitch_hz}")


class ToyVoice:
    def __init__(self, name: str, pitch_hz: float) -> None:
        self._info = VoiceInfo(name=name, family="toy", sample_rate=RATE)
        self._pitch_hz = pitch_hz
        self._phase = 0

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        n = int(len(request.text) * MS_PER_CHAR * RATE / 1000)
        t = (self._phase + np.arange(n)) / RATE
        self._phase += n
        yield PcmChunk(0.3 * np.sin(2 * np.pi * self._pitch_hz * t).astype(np.float32), RATE)

    async def close(self) -> None:
        return None


async def _load(specs: Sequence[str], section: object, settings: VoiceSettings,
                progress: Callable[[str], None]) -> FamilyVoices:
    cfg = section if isinstance(section, ToySection) else ToySection()
    out = FamilyVoices(voices={}, by_spec={})
    for spec in specs:
        prefix, _, speaker = spec.partition(":")
        if prefix != "toy" or not speaker.isalpha():
            raise UnknownVoice(f"toy voices are toy:<letters>, not {spec}")
        voice = ToyVoice(spec, cfg.pitch_hz)
        out.voices[spec] = voice
        out.by_spec[spec] = spec
        out.warm_up_via.append(voice)
    return out


FAMILY = VoiceFamily(name="toy", load=_load, section=ToySection,
                     description="a sine tone per character (a plug-in test)")
