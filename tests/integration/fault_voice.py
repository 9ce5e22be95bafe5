"""A fault-injecting voice family for tests, registered through the voice
registry from the test process (production code knows nothing of it).

``faulty:<mode>`` voices speak 100 ms chunks of a tone, one every 20 ms, and:

- ``ok``: 30 chunks per segment (3 s of audio);
- ``die``: fail mid-stream (RuntimeError after 2 chunks: a voice bug);
- ``dead``: its engine dies mid-stream (``EngineDead`` after 2 chunks);
- ``hang``: one chunk, then waits for ever (for cancel and disconnect tests).

``LEDGER`` counts generators begun and closed, so a test sees that cancel or
a dropped connection closed the voice at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rtserver.audio.pcm import PcmChunk
from rtserver.errors import EngineDead
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings, register_family

RATE = 24000
CHUNK = RATE // 10  # 100 ms


@dataclass
class Ledger:
    begun: int = 0
    closed: int = 0

    @property
    def open(self) -> int:
        return self.begun - self.closed


LEDGER = Ledger()


class FaultyVoice:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._info = VoiceInfo(name=f"faulty:{mode}", family="faulty", sample_rate=RATE,
                               description="test voice that fails on purpose")

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        LEDGER.begun += 1
        tone = (0.1 * np.sin(np.arange(CHUNK) * 2 * np.pi * 440 / RATE)).astype(np.float32)
        try:
            for i in range(30):
                await asyncio.sleep(0.02)
                if i == 2 and self.mode == "die":
                    raise RuntimeError("injected voice fault")
                if i == 2 and self.mode == "dead":
                    raise EngineDead("injected engine death")
                if i == 1 and self.mode == "hang":
                    await asyncio.Event().wait()
                yield PcmChunk(tone, RATE)
        finally:
            LEDGER.closed += 1

    async def close(self) -> None:
        return None


async def _load(specs: Sequence[str], section: object, settings: VoiceSettings,
                progress: Callable[[str], None]) -> FamilyVoices:
    out = FamilyVoices(voices={}, by_spec={})
    for spec in specs:
        voice = FaultyVoice(spec.partition(":")[2] or "ok")
        out.voices[voice.info.name] = voice
        out.by_spec[spec] = voice.info.name
    return out


FAMILY = register_family(VoiceFamily(name="faulty", load=_load,
                                     description="fault-injecting test voices"))
