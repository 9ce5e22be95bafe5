"""A context whose first chunk comes much later than its voice's usual is
hinted again before its first audio.

The browser test on CI (2026-12-06): on a 2-core machine shared with
Chromium, a first chunk took 193 ms where ~45 is usual and the next chunk
came at 5x the measured r; the hint, planned with that r, let the page start
on the first chunk (40 ms) and it ran dry. A fake voice with Piper's chunk
plan on an injected clock, no sockets; the listener is
``hints.simulate_playback`` taking the latest hint before the first audio.
"""

from __future__ import annotations

import asyncio

import pytest

from rtserver.clock import ManualClock
from rtserver.core import AudioFrames, SpeechCore
from rtserver.pacing.hints import HintConfig, simulate_playback
from rtserver.protocol.messages import BufferHint, Start
from rtserver.testing.wait import wait_until_async
from rtserver.text.segmenter import SegmenterConfig
from tests.unit.test_core_heard_hint import COST_MS, OPUS, PlannedVoice, TimedSink, speak_one

R = 0.05  # low enough that the usual hint starts on the first chunk


def _hints_before_audio(sink: TimedSink) -> list[BufferHint]:
    out: list[BufferHint] = []
    for e in sink.events:
        if isinstance(e, AudioFrames):
            return out
        if isinstance(e, BufferHint):
            out.append(e)
    return out


def _listener_underruns(sink: TimedSink, prebuffer_ms: float) -> int:
    """Underruns of a listener that buffers ``prebuffer_ms``, every chunk after
    the first as late as the hint's jitter allowance (40 ms) permits."""
    t0 = sink.sent[0][0]
    arrivals = [(1000.0 * (t - t0), 20.0 * n) for t, n in sink.sent]
    arrivals[0] = (arrivals[0][0], arrivals[0][1] - 6.5)  # the Opus pre-skip
    late = [(at + 39.0 if at > 0 else at, ms) for at, ms in arrivals]
    return simulate_playback(late, prebuffer_ms).underruns


def _core(voice: PlannedVoice, clock: ManualClock) -> SpeechCore:
    return SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock)


async def test_a_slow_first_chunk_asks_the_listener_to_wait_for_more() -> None:
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock, rtf=R)
    core = _core(voice, clock)
    for k in range(3):  # the voice's usual first chunk, and its r
        usual = await speak_one(core, clock, f"usual{k}")
    [hint] = _hints_before_audio(usual)  # a usual start: one hint, and it holds
    assert _listener_underruns(usual, hint.prebuffer_ms) == 0
    voice.slow = 4.0  # something else takes the cores now
    sink = await speak_one(core, clock, "slow")
    first, again = _hints_before_audio(sink)
    assert again.prebuffer_ms > first.prebuffer_ms
    assert again.rtf == pytest.approx(4.0 * first.rtf, rel=0.01)
    # The hint planned with the old r would have run dry; the new one holds.
    assert _listener_underruns(sink, first.prebuffer_ms) >= 1
    assert _listener_underruns(sink, again.prebuffer_ms) == 0
    slow_starts = core.metrics.slow_starts.labels(voice.info.name)._value.get()
    assert slow_starts == 1
    # The server's own estimate of first heard audio uses the hint in force.
    assert core.metrics.first_heard_seconds.labels(voice.info.name)._sum.get() > 0


async def test_usual_first_chunks_are_not_hinted_again() -> None:
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock, rtf=R)
    core = _core(voice, clock)
    voice.slow = 3.0  # the first context has nothing to compare with
    assert len(_hints_before_audio(await speak_one(core, clock, "first"))) == 1
    for k, slow in enumerate((1.0, 1.5, 1.9)):  # within the factor of the usual
        voice.slow = slow
        assert len(_hints_before_audio(await speak_one(core, clock, f"c{k}"))) == 1
    assert core.metrics.slow_starts.labels(voice.info.name)._value.get() == 0


async def test_a_guess_waiting_for_its_cut_is_not_a_slow_start() -> None:
    """A speculative first segment made its first chunk at once, then waited
    5 s for the text that confirms its cut: that wait is the client's, not
    the host's, and asks for no more buffering."""
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock, rtf=R)
    core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_max_words=3, first_wait_s=60),
                      clock=clock)
    for k in range(2):
        await speak_one(core, clock, f"usual{k}")
    sink = TimedSink(clock)
    ctx = core.open(Start(context="guess", **OPUS), sink)  # type: ignore[arg-type]
    async with asyncio.TaskGroup() as group:
        run = group.create_task(ctx.run())
        made_at = clock.now() + R * sum(COST_MS) / 1000.0  # the voice moves the clock
        ctx.feed("One two three")
        await wait_until_async(lambda: clock.now() >= made_at - 1e-9,
                               "the guess made all its chunks")
        assert core.metrics.first_segment_guesses.labels(
            voice.info.name, "started")._value.get() == 1
        clock.advance(5.0)
        ctx.feed(" four.")
        ctx.end()
        assert await run == "done"
    assert core.metrics.first_segment_guesses.labels(
        voice.info.name, "adopted")._value.get() == 1
    assert len(_hints_before_audio(sink)) == 1
    assert core.metrics.slow_starts.labels(voice.info.name)._value.get() == 0


def test_the_slow_start_factor_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="slow_start_factor"):
        HintConfig(slow_start_factor=1.0)
    with pytest.raises(ValueError, match="first_chunk_window"):
        HintConfig(first_chunk_window=0)
