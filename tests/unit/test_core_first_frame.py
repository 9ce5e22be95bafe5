"""A streaming voice's first small chunk reaches the outbox at once.

The Orpheus vocoder's first chunk is 768 samples at 24 kHz (32 ms). Before,
the core resampled it to 48 kHz, soxr held all of it back, and the first
frame waited for the voice's next chunk (about 4 frames of tokens later).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import opuslib
import pytest

from rtserver.audio.pcm import PcmChunk
from rtserver.core import AudioFrames, EventQueue, SpeechContext, SpeechCore
from rtserver.protocol.messages import Start
from rtserver.voices.base import SynthesisRequest, VoiceInfo


class GatedVoice:
    """Yields a 768-sample chunk, then a second one once ``gate`` is set."""

    def __init__(self, rate: int) -> None:
        self.info = VoiceInfo(name="gated", family="test", sample_rate=rate,
                              chunk_plan_ms=(32.0, 170.0))
        self.gate = asyncio.Event()

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        t = np.arange(768) / self.info.sample_rate
        yield PcmChunk((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                       self.info.sample_rate)
        await self.gate.wait()
        yield PcmChunk(np.zeros(4096, dtype=np.float32), self.info.sample_rate)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _context(voice: GatedVoice, start: Start, sink: EventQueue) -> SpeechContext:
    core = SpeechCore({voice.info.name: voice})  # type: ignore[dict-item]
    return core.open(start, sink)


async def _first_audio(sink: EventQueue, limit_s: float = 5.0) -> AudioFrames:
    async def wait() -> AudioFrames:
        while True:
            item = await sink.get()
            if isinstance(item, AudioFrames):
                return item
    return await asyncio.wait_for(wait(), limit_s)


@pytest.mark.parametrize("requested", [48000, 24000])
async def test_first_32_ms_of_a_24khz_voice_go_out_before_its_next_chunk(requested: int) -> None:
    voice = GatedVoice(24000)
    start = Start(context="c", format="opus", sample_rate=requested)
    sink = EventQueue(capacity_ms=10_000)
    ctx = _context(voice, start, sink)
    assert ctx.speaker.rate == 24000  # Opus takes SNAC's rate as input directly
    async with asyncio.TaskGroup() as group:
        speak = group.create_task(ctx.run())
        ctx.feed("Hello there, ")
        ctx.end()
        item = await _first_audio(sink)  # the gate is still closed
        assert not speak.done()
        # 32 ms of audio: one 20 ms frame now (the rest waits for a whole frame)
        assert len(item.frames) == 1
        decoder = opuslib.Decoder(requested, 1)
        pcm = np.frombuffer(decoder.decode(item.frames[0], requested // 50), dtype=np.int16)
        assert len(pcm) == requested // 50  # the client decodes at the rate it asked for
        voice.gate.set()
    # TTFA's parts went to /metrics (the queue delivered the first frame: "send"
    # is the time it waited to be taken)
    body = ctx.shared.metrics.render().decode()
    for stage in ("segmenter", "queue", "vocoder", "encode", "send"):
        assert (f'rtserver_first_audio_stage_seconds_count{{stage="{stage}",voice="gated"}} 1.0'
                in body), stage
    assert 'stage="model"' not in body


def test_rates_opus_cannot_take_are_resampled_to_the_requested_rate() -> None:
    sink = EventQueue(capacity_ms=1000)
    piper_like = _context(GatedVoice(22050), Start(context="c", format="opus"), sink)
    assert piper_like.speaker.rate == 48000
    above = _context(GatedVoice(24000), Start(context="c", format="opus", sample_rate=16000),
                     sink)
    assert above.speaker.rate == 16000  # never encode above what the client asked for
    pcm = _context(GatedVoice(24000), Start(context="c", format="pcm_s16le"), sink)
    assert pcm.speaker.rate == 48000  # PCM is sent at the requested rate
