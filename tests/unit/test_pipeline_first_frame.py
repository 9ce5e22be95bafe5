"""A streaming voice's first small chunk reaches the outbox at once.

The Orpheus vocoder's first chunk is 768 samples at 24 kHz (32 ms). Before,
the pipeline resampled it to 48 kHz, soxr held all of it back, and the first
frame waited for the voice's next chunk (about 4 frames of tokens later).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import opuslib
import pytest

from rtserver.audio.opus import OpusConfig
from rtserver.audio.pcm import PcmChunk
from rtserver.metrics import Metrics
from rtserver.pacing.hints import HintConfig
from rtserver.pacing.rates import RtfTracker
from rtserver.pipeline import ContextPipeline, VoiceStats
from rtserver.protocol.messages import Start
from rtserver.server.outbox import AudioItem, ContextLedger, Outbox
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import SynthesisRequest, VoiceInfo


class GatedVoice:
    """Yields a 768-sample chunk, then a second one once ``gate`` is set."""

    def __init__(self, rate: int) -> None:
        self.info = VoiceInfo(name="gated", family="test", sample_rate=rate,
                              chunk_plan_ms=(32.0, 170.0))
        self.gate = asyncio.Event()

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        t = np.arange(768) / self.info.sample_rate
        yield PcmChunk((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                       self.info.sample_rate)
        await self.gate.wait()
        yield PcmChunk(np.zeros(4096, dtype=np.float32), self.info.sample_rate)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _pipeline(voice: GatedVoice, start: Start, outbox: Outbox) -> ContextPipeline:
    ledger = ContextLedger(context=start.context, stream=1, frame_ms=start.frame_ms)
    return ContextPipeline(
        context=start.context, start=start, voice=voice, ledger=ledger,  # type: ignore[arg-type]
        outbox=outbox, voice_stats=VoiceStats(RtfTracker()),
        segmenter_config=SegmenterConfig(), hint_config=HintConfig(),
        opus_config=OpusConfig(), metrics=Metrics())


async def _first_audio(outbox: Outbox, limit_s: float = 5.0) -> AudioItem:
    async def wait() -> AudioItem:
        while True:
            item = await outbox.get_batch(50)
            if isinstance(item, AudioItem):
                return item
    return await asyncio.wait_for(wait(), limit_s)


@pytest.mark.parametrize("requested", [48000, 24000])
async def test_first_32_ms_of_a_24khz_voice_go_out_before_its_next_chunk(requested: int) -> None:
    voice = GatedVoice(24000)
    start = Start(context="c", format="opus", sample_rate=requested)
    outbox = Outbox(capacity_ms=10_000)
    pipe = _pipeline(voice, start, outbox)
    assert pipe.encode_rate() == 24000  # Opus takes SNAC's rate as input directly
    async with asyncio.TaskGroup() as group:
        group.create_task(pipe.segment_loop())
        speak = group.create_task(pipe.speak_loop())
        pipe.feed("Hello there, ")
        pipe.end()
        item = await _first_audio(outbox)  # the gate is still closed
        assert not speak.done()
        # 32 ms of audio: one 20 ms frame now (the rest waits for a whole frame)
        assert len(item.frames) == 1
        decoder = opuslib.Decoder(requested, 1)
        pcm = np.frombuffer(decoder.decode(item.frames[0], requested // 50), dtype=np.int16)
        assert len(pcm) == requested // 50  # the client decodes at the rate it asked for
        voice.gate.set()
    # TTFA's parts went to /metrics (no socket here: no "send" part)
    body = pipe.metrics.render().decode()
    for stage in ("segmenter", "queue", "vocoder", "encode"):
        assert (f'rtserver_first_audio_stage_ms_count{{stage="{stage}",voice="gated"}} 1.0'
                in body), stage
    assert 'stage="send"' not in body and 'stage="model"' not in body


def test_rates_opus_cannot_take_are_resampled_to_the_requested_rate() -> None:
    outbox = Outbox(capacity_ms=1000)
    piper_like = _pipeline(GatedVoice(22050), Start(context="c", format="opus"), outbox)
    assert piper_like.encode_rate() == 48000
    above = _pipeline(GatedVoice(24000), Start(context="c", format="opus", sample_rate=16000),
                      outbox)
    assert above.encode_rate() == 16000  # never encode above what the client asked for
    pcm = _pipeline(GatedVoice(24000), Start(context="c", format="pcm_s16le"), outbox)
    assert pcm.encode_rate() == 48000  # PCM is sent at the requested rate
