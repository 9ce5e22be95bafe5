"""PROTOCOL.md's "Order and guarantees" and the cancel fence as properties of
the speech core: a fake voice, a recording sink, an injected clock; no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np
import pytest

from rtserver.audio.pcm import PcmChunk
from rtserver.clock import ManualClock
from rtserver.core import (
    AudioFrames,
    ControlEvent,
    Finished,
    SinkClosed,
    SpeechCore,
    speak,
)
from rtserver.errors import EngineFailed
from rtserver.protocol.messages import (
    BufferHint,
    Cancelled,
    Done,
    ErrorMessage,
    SegmentStarted,
    Start,
)
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import SynthesisRequest, VoiceInfo

RATE = 16000
PCM = dict(format="pcm_s16le", sample_rate=RATE, frame_ms=20)


@dataclass
class FakeVoice:
    """Speaks each segment as ``chunks`` chunks of ``chunk_ms``; the clock moves
    ``model_s`` before the first one (the model's time). ``gate``: chunks after
    the first ``free`` wait for it. ``fail_on``: a segment text that raises."""

    clock: ManualClock
    chunks: int = 3
    chunk_ms: int = 50
    model_s: float = 0.04
    fail_on: str = ""
    gate: asyncio.Event | None = None
    free: int = 1
    blocked: asyncio.Event = field(default_factory=asyncio.Event)
    closed_streams: int = 0
    info: VoiceInfo = field(default_factory=lambda: VoiceInfo(
        name="fake:v", family="fake", sample_rate=RATE))

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        try:
            self.clock.advance(self.model_s)
            for i in range(self.chunks):
                if request.text == self.fail_on and i == 1:
                    raise EngineFailed("the fake engine broke")
                if i >= self.free and self.gate is not None:
                    self.blocked.set()
                    await self.gate.wait()
                yield PcmChunk(np.full(RATE * self.chunk_ms // 1000, 0.1, np.float32), RATE)
        finally:
            self.closed_streams += 1


class RecordingSink:
    """Records every event in order. Audio is delivered at once unless
    ``hold`` is set: then it waits in ``held`` until ``deliver()``, and
    ``audio()`` blocks while ``capacity`` frames are held (backpressure)."""

    def __init__(self, *, hold: bool = False, capacity: int = 10_000) -> None:
        self.events: list[object] = []
        self.held: list[AudioFrames | Finished] = []
        self.hold = hold
        self.capacity = capacity
        self.fenced: list[str] = []
        self._space = asyncio.Event()
        self.closed = False

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None:
        self.events.append(event)

    async def audio(self, event: AudioFrames) -> None:
        if self.closed:
            raise SinkClosed("closed")
        if not self.hold:
            event.ledger.delivered(event.seq + len(event.frames) - 1)
            self.events.append(event)
            return
        while sum(len(e.frames) for e in self.held if isinstance(e, AudioFrames)) \
                >= self.capacity:
            self._space.clear()
            await self._space.wait()
        self.held.append(event)

    def deliver(self, n: int | None = None) -> None:
        take, self.held = self.held[:n], self.held[n:] if n is not None else []
        for event in take:
            if isinstance(event, Finished):  # its frames are out: build `done` now
                self.events.append(event.done())
                continue
            event.ledger.delivered(event.seq + len(event.frames) - 1)
            self.events.append(event)
        self._space.set()

    def finish(self, event: Finished) -> None:
        if self.hold:
            self.held.append(event)
        else:
            self.events.append(event.done())

    def fence(self, context: str) -> None:
        self.fenced.append(context)
        self.held = [e for e in self.held if e.context != context]


def core_with(voice: FakeVoice, clock: ManualClock) -> SpeechCore:
    return SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock)


def audio_of(events: list[object]) -> list[AudioFrames]:
    return [e for e in events if isinstance(e, AudioFrames)]


async def test_order_seqs_and_flags_of_a_context_that_speaks_to_its_end() -> None:
    clock = ManualClock(100.0)
    voice = FakeVoice(clock)
    core = core_with(voice, clock)
    sink = RecordingSink()
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("Hello there. ")
    ctx.feed("How are you today? ")
    ctx.feed("Fine.")
    ctx.end()
    assert await ctx.run() == "done"
    events = sink.events
    assert isinstance(events[-1], Done)  # done after the last frame, nothing after it
    frames = audio_of(events)
    seqs = [f.seq + i for f in frames for i in range(len(f.frames))]
    assert seqs == list(range(len(seqs)))  # from 0, consecutive
    segments = [e for e in events if isinstance(e, SegmentStarted)]
    assert [s.index for s in segments] == [0, 1, 2]
    for seg in segments:  # `segment` comes before the first frame of its segment ...
        first = next(f for f in frames if f.seq + len(f.frames) > seg.seq)
        assert events.index(seg) < events.index(first)
        assert first.seq == seg.seq and first.segment_start  # ... which carries the flag
    assert sum(f.segment_start for f in frames) == 3
    assert [f.last for f in frames].count(True) == 1 and frames[-1].last
    # a hint precedes the audio it describes
    assert isinstance(events[events.index(segments[0]) + 1], BufferHint)
    done = events[-1]
    assert isinstance(done, Done)
    assert done.frames == len(seqs) and done.audio_ms == 20.0 * len(seqs)
    assert done.spoken_text == "Hello there. How are you today? Fine."
    # 3 segments of 3 x 50 ms: 450 ms, framed in 20 ms (the last padded)
    assert len(seqs) == 23
    assert core.load.active == 0 and ctx.outcome == "done"


async def test_ttfa_runs_on_the_injected_clock() -> None:
    clock = ManualClock(5.0)
    voice = FakeVoice(clock, model_s=0.04)
    core = core_with(voice, clock)
    sink = RecordingSink()
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("Hello there.")  # arrives at 5.0, completes the first segment
    ctx.end()
    await ctx.run()
    done = sink.events[-1]
    assert isinstance(done, Done) and done.ttfa_ms == 40.0  # the model's 40 ms, exactly
    body = core.metrics.render().decode()
    assert 'rtserver_ttfa_seconds_count{voice="fake:v"} 1.0' in body
    assert 'rtserver_contexts_total{outcome="done"} 1.0' in body


async def test_cancel_fences_the_context_at_the_last_delivered_frame() -> None:
    clock = ManualClock()
    voice = FakeVoice(clock, chunks=10, gate=asyncio.Event(), free=3)
    core = core_with(voice, clock)
    sink = RecordingSink(hold=True)
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("A sentence that is still being spoken when the listener barges in.")
    ctx.end()
    task = asyncio.create_task(ctx.run())
    await voice.blocked.wait()  # three chunks framed, waiting in the sink
    sink.deliver(1)  # one message reaches the client, the rest is queued
    assert sink.held
    delivered = audio_of(sink.events)
    last = delivered[-1].seq + len(delivered[-1].frames) - 1
    await ctx.cancel()
    assert task.cancelled() or task.done()
    assert sink.fenced == ["c"] and sink.held == []  # unsent audio dropped
    voice.gate.set()
    await asyncio.sleep(0.01)
    assert sink.events[-1] == Cancelled(context="c", last_seq=last)
    assert ctx.ledger.fenced and voice.closed_streams == 1  # the synthesis was closed
    sink.deliver()
    assert sink.events[-1] == Cancelled(context="c", last_seq=last)  # nothing after it
    assert core.load.active == 0 and ctx.outcome == "cancelled"
    await ctx.cancel()  # twice: no second `cancelled`
    assert [type(e) for e in sink.events].count(Cancelled) == 1


async def test_cancel_before_the_context_ran_emits_only_cancelled() -> None:
    clock = ManualClock()
    core = core_with(FakeVoice(clock), clock)
    sink = RecordingSink()
    ctx = core.open(Start(context="c", **PCM), sink)
    await ctx.cancel()
    assert await ctx.run() == "cancelled"
    assert sink.events == [Cancelled(context="c", last_seq=-1)]


async def test_a_full_sink_makes_the_context_wait_and_no_audio_is_lost() -> None:
    clock = ManualClock()
    voice = FakeVoice(clock, chunks=6)
    core = core_with(voice, clock)
    sink = RecordingSink(hold=True, capacity=5)
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("One sentence of speech.")
    ctx.end()
    task = asyncio.create_task(ctx.run())
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done()  # 300 ms of audio, 100 ms of room: the producer waits
    assert sum(len(e.frames) for e in sink.held) <= 5 + 3  # the cap plus one put
    while not task.done():
        sink.deliver()
        await asyncio.sleep(0)
    sink.deliver()
    frames = audio_of(sink.events)
    seqs = [f.seq + i for f in frames for i in range(len(f.frames))]
    assert seqs == list(range(15)) and isinstance(sink.events[-1], Done)


async def test_a_failing_voice_fails_its_context_only() -> None:
    clock = ManualClock()
    voice = FakeVoice(clock, fail_on="Broken here.")
    core = core_with(voice, clock)
    sink = RecordingSink()
    bad = core.open(Start(context="bad", **PCM), sink)
    good = core.open(Start(context="good", **PCM), sink)
    for ctx, text in ((bad, "Fine first. Broken here. Never said."), (good, "All fine.")):
        ctx.feed(text)
        ctx.end()
    outcomes = await asyncio.gather(bad.run(), good.run())
    assert outcomes == ["failed", "done"]
    bad_events = [e for e in sink.events if getattr(e, "context", None) == "bad"]
    error = bad_events[-1]
    assert isinstance(error, ErrorMessage) and error.code == "engine_failed"
    assert not any(isinstance(e, Done) for e in bad_events)  # error, not done, ends it
    good_events = [e for e in sink.events if getattr(e, "context", None) == "good"]
    assert isinstance(good_events[-1], Done) and good_events[-1].frames == 8
    assert core.load.active == 0
    assert voice.closed_streams == 3  # every synthesis closed, the failed one too


async def test_a_closed_sink_ends_the_context_without_an_outcome() -> None:
    clock = ManualClock()
    core = core_with(FakeVoice(clock), clock)
    sink = RecordingSink()
    sink.closed = True
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("Hello.")
    ctx.end()
    assert await ctx.run() == "closed"
    assert core.load.active == 0 and not any(isinstance(e, ErrorMessage) for e in sink.events)


async def test_speak_iterates_one_context_and_cancels_it_when_left_early() -> None:
    clock = ManualClock()
    voice = FakeVoice(clock)
    core = core_with(voice, clock)
    kinds: list[str] = []
    async with speak(core, Start(context="s", **PCM), capacity_ms=100) as stream:
        stream.feed("Hello there. Bye.")
        stream.end()
        async for event in stream.events():
            kinds.append(type(event).__name__)
    assert kinds[0] == "SegmentStarted" and kinds[-1] == "Done"
    assert kinds.count("AudioFrames") >= 2
    async with speak(core, Start(context="t", **PCM), capacity_ms=40) as stream:
        stream.feed("A long first sentence here. And more.")
        stream.end()
        async for event in stream.events():
            if isinstance(event, AudioFrames):
                break  # leave with audio still coming
    assert core.load.active == 0
    assert 'outcome="cancelled"} 1.0' in core.metrics.render().decode()


def test_options_the_core_cannot_serve_are_refused_with_their_code() -> None:
    clock = ManualClock()
    core = core_with(FakeVoice(clock), clock)
    sink = RecordingSink()
    with pytest.raises(Exception, match="unknown voice 'nobody'") as e1:
        core.open(Start(context="c", voice="nobody"), sink)
    with pytest.raises(Exception, match="format") as e2:
        core.open(Start(context="c", sample_rate=44100), sink)
    assert [getattr(e.value, "code", None) for e in (e1, e2)] == ["unknown_voice",
                                                                  "unsupported_format"]
    assert core.load.active == 0


async def test_a_voice_that_raises_a_connection_error_fails_its_context_loudly() -> None:
    """Only SinkClosed (the client left) ends a context quietly: a voice's own
    ConnectionError (an engine's socket, say) is its fault, engine_failed."""

    class Dropping(FakeVoice):
        async def synthesize(self, request: SynthesisRequest
                             ) -> AsyncGenerator[PcmChunk, None]:
            yield PcmChunk(np.full(RATE // 20, 0.1, np.float32), RATE)
            raise ConnectionResetError("the engine's socket dropped")

    clock = ManualClock()
    core = core_with(Dropping(clock), clock)
    sink = RecordingSink()
    ctx = core.open(Start(context="c", **PCM), sink)
    ctx.feed("Hello there.")
    ctx.end()
    assert await ctx.run() == "failed"
    error = sink.events[-1]
    assert isinstance(error, ErrorMessage) and error.code == "engine_failed"
    assert core.load.active == 0
