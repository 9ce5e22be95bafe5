"""The core's `buffer` hint plans with the audio a listener actually gets.

A streaming voice at 22050 Hz (Piper's chunk plan) spoken to an Opus client at
48 kHz: the resampler holds back a little of every chunk, the framer sends
whole frames and the decoder drops its pre-skip, so Piper's 109 ms first chunk
is heard as 93.5 ms. (With libsoxr it was 53.5 ms, and a hint planned with the
voice's own sizes let a listener start on it and run dry: the browser test on
CI, 2026-12-03.) A fake voice on an injected clock, no sockets; the listener
is ``hints.simulate_playback``, with every chunk after the first as late as
the network allowance (40 ms) permits.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np

from rtserver.audio.pcm import PcmChunk
from rtserver.clock import ManualClock
from rtserver.core import AudioFrames, SpeechCore
from rtserver.pacing.hints import prebuffer_ms, simulate_playback
from rtserver.protocol.messages import BufferHint, Start
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from tests.unit.test_core_guarantees import RecordingSink

RATE = 22050
# Piper en_US-joe-medium's eager plan and costs (VoiceInfo of the embedded
# voice); the costs share out the plan's whole duration, so r measured over a
# segment is R
PLAN_MS = (109.297, 464.399, 928.798, 1509.297, 1509.297, 1509.297)
COST_MS = (1838.629, 409.618, 689.523, 1030.872, 1030.872, 1030.872)
R = 0.15  # model time per cost: Piper on the 2-core CI machine measured 0.158
OPUS = dict(format="opus", sample_rate=48000, frame_ms=20)


@dataclass
class PlannedVoice:
    """Yields ``PLAN_MS`` chunks; before chunk k the clock moves
    ``rtf * slow * COST_MS[k]`` (``slow``: how much slower the host is now)."""

    clock: ManualClock
    rtf: float = R
    slow: float = 1.0
    info: VoiceInfo = field(default_factory=lambda: VoiceInfo(
        name="planned:v", family="planned", sample_rate=RATE,
        chunk_plan_ms=PLAN_MS, chunk_cost_ms=COST_MS))

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        for ms, cost in zip(PLAN_MS, COST_MS, strict=True):
            self.clock.advance(self.rtf * self.slow * cost / 1000.0)
            yield PcmChunk(np.full(round(ms * RATE / 1000), 0.1, np.float32), RATE)


class TimedSink(RecordingSink):
    """Also stamps every audio message with the clock when it is sent."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.sent: list[tuple[float, int]] = []  # (time s, frames)

    async def audio(self, event: AudioFrames) -> None:
        self.sent.append((self.clock.now(), len(event.frames)))
        await super().audio(event)


async def speak_one(core: SpeechCore, clock: ManualClock, name: str) -> TimedSink:
    """Context ``name``: one sentence, fed and ended at once, spoken to the end."""
    sink = TimedSink(clock)
    ctx = core.open(Start(context=name, **OPUS), sink)  # type: ignore[arg-type]
    ctx.feed("One sentence, spoken in chunks.")
    ctx.end()
    assert await ctx.run() == "done"
    return sink


async def test_a_listener_that_honours_the_hint_does_not_run_dry() -> None:
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock)
    core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock)
    await speak_one(core, clock, "warm")  # the voice's measured r is now R
    sink = await speak_one(core, clock, "c")
    hint = next(e for e in sink.events if isinstance(e, BufferHint))
    assert abs(hint.rtf - R) < 0.01
    # What the listener holds as it arrives: 20 ms frames, less the Opus
    # pre-skip (312 samples at 48 kHz) at the very start.
    t0 = sink.sent[0][0]
    arrivals = [(1000.0 * (t - t0), 20.0 * n) for t, n in sink.sent]
    arrivals[0] = (arrivals[0][0], arrivals[0][1] - 6.5)
    # The first chunk went out short: part held back, part framed later.
    first_chunk_out = sum(ms for at, ms in arrivals if at == 0.0)
    assert first_chunk_out < PLAN_MS[0]
    # Every later chunk as late as the hint's jitter allowance (40 ms) permits.
    late = [(at + 39.0 if at > 0 else at, ms) for at, ms in arrivals]
    # Honouring the hint, the listener never runs dry ...
    assert simulate_playback(late, hint.prebuffer_ms).underruns == 0
    # ... where the plan at the voice's own sizes said "start on the first
    # chunk" and underran (this test fails on the hint as it was computed).
    naive = prebuffer_ms(hint.rtf, PLAN_MS, 40.0, cost_ms=COST_MS)
    assert naive < first_chunk_out
    assert simulate_playback(late, naive).underruns == 1
