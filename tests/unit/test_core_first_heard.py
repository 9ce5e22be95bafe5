"""The core's one first-heard model: the pure maths, and ``SpeechCore.
predicted_first_heard_ms`` (what the WebSocket path and the HTTP API ask
admission with) against what a listener of the context really gets."""

from __future__ import annotations

import dataclasses

import pytest

from rtserver.clock import ManualClock
from rtserver.core import SpeechCore
from rtserver.core.first_heard import (
    FIRST_SEGMENT_CHARS,
    first_heard_ms,
    hint_chunks,
)
from rtserver.core.framing import HeardFormat
from rtserver.pacing.hints import prebuffer_ms, simulate_playback
from rtserver.protocol.messages import BufferHint, Start
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import VoiceInfo
from tests.unit.test_core_heard_hint import (
    COST_MS,
    OPUS,
    PLAN_MS,
    PlannedVoice,
    R,
    TimedSink,
    speak_one,
)


def test_first_heard_one_chunk_is_its_synthesis() -> None:
    # Piper: the first segment is one chunk of 1 s made at r 0.2; the hint
    # (J = 40 ms of audio) is held as soon as it arrives
    assert first_heard_ms(0.2, [1000.0], 40.0) == pytest.approx(200.0)


def test_first_heard_waits_for_the_prebuffer_chunk() -> None:
    chunks = [100.0, 300.0, 1000.0]
    heard = first_heard_ms(0.5, chunks, 40.0)
    # the hint waits for chunk 2 (hints.py's example): it arrives at
    # 0.5 * (100 + 300 + 1000) = 700 ms
    assert prebuffer_ms(0.5, chunks, 40.0) == pytest.approx(440.0)
    assert heard == pytest.approx(700.0)


def test_first_heard_grows_with_r() -> None:
    chunks = [500.0, 1000.0, 2000.0, 4000.0]
    values = [first_heard_ms(r, chunks, 40.0) for r in (0.1, 0.5, 0.9, 1.5)]
    assert values == sorted(values) and values[-1] > 5000


def test_hint_chunks_of_a_sentence_voice_and_of_a_streaming_one() -> None:
    heard = HeardFormat(in_rate=24000, out_rate=24000, frame_samples=480, pre_skip=0)
    sentence = VoiceInfo(name="s", family="t", sample_rate=24000)
    chunks, cost = hint_chunks(sentence, heard, at_start=True, segment_chars=36, index=0,
                               audio_ms_per_char=50.0, limit=lambda k: 80 if k else 250)
    assert chunks == [36 * 50.0] + [80 * 50.0] * 4 and cost is None
    streaming = VoiceInfo(name="v", family="t", sample_rate=24000,
                          chunk_plan_ms=(60.0, 120.0), chunk_cost_ms=(90.0, 150.0))
    chunks, cost = hint_chunks(streaming, heard, at_start=True, segment_chars=36, index=0,
                               audio_ms_per_char=50.0, limit=lambda k: 250)
    assert chunks == [60.0, 120.0] and cost == [90.0, 150.0]  # whole frames already


def test_a_first_segment_plan_is_the_first_hint_s_plan() -> None:
    """A voice with a plan of its own for first segments (Orpheus: chunks
    that stop growing sooner) has its first hint planned with it, and later
    segments' with the general plan; at a high r the smaller chunks let its
    listener start far sooner (why it has one)."""
    heard = HeardFormat(in_rate=24000, out_rate=24000, frame_samples=480, pre_skip=0)
    # whole 20 ms frames, as the listener gets them (HeardFormat.chunks_ms)
    general, general_cost = (40.0, 180.0, 340.0, 680.0, 1360.0), (80.0, 340.0, 340.0, 680.0,
                                                                   1360.0)
    first, first_cost = (40.0, 180.0, 340.0, 520.0, 520.0), (80.0, 340.0, 340.0, 520.0, 520.0)
    voice = VoiceInfo(name="v", family="t", sample_rate=24000, chunk_plan_ms=general,
                      chunk_cost_ms=general_cost, first_chunk_plan_ms=first,
                      first_chunk_cost_ms=first_cost)
    for index, plan, cost in ((0, first, first_cost), (1, general, general_cost)):
        chunks, costs = hint_chunks(voice, heard, at_start=index == 0, segment_chars=36,
                                    index=index, audio_ms_per_char=50.0, limit=lambda k: 250)
        assert chunks == list(plan) and costs == list(cost)
    assert first_heard_ms(0.85, list(first), 40.0, cost_ms=list(first_cost)) < 0.7 * \
        first_heard_ms(0.85, list(general), 40.0, cost_ms=list(general_cost))


def test_nothing_measured_predicts_nothing_to_refuse_on() -> None:
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock)
    core = SpeechCore({voice.info.name: voice}, clock=clock)  # type: ignore[dict-item]
    assert core.predicted_first_heard_ms(Start(context="c", **OPUS)) == 0.0  # type: ignore[arg-type]


async def test_the_prediction_is_when_a_listener_of_the_context_starts_playing() -> None:
    """Admission's prediction for a new context equals the moment a listener
    honouring that context's first hint starts playing, counted from the
    text that completed its first segment (PROTOCOL.md's TTFA origin)."""
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock)
    core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock)
    await speak_one(core, clock, "warm")  # the voice is measured: r is R
    start = Start(context="c", **OPUS)  # type: ignore[arg-type]
    predicted = core.predicted_first_heard_ms(start)
    text_at = clock.now()  # the whole sentence arrives now (speak_one feeds, then ends)
    sink = await speak_one(core, clock, "c")
    hint = next(e for e in sink.events if isinstance(e, BufferHint))
    # the listener holds what arrives: 20 ms frames, less the Opus pre-skip
    # (6.5 ms) at the very start; it starts once it holds the hint
    arrivals = [(1000.0 * (t - text_at), 20.0 * n) for t, n in sink.sent]
    arrivals[0] = (arrivals[0][0], arrivals[0][1] - 6.5)
    started = simulate_playback(arrivals, hint.prebuffer_ms).start_ms
    assert started is not None and started > R * COST_MS[0]  # not on chunk 0
    assert predicted == pytest.approx(started, abs=1.0)
    # planned with the voice's own chunk sizes, it would promise chunk 0
    assert first_heard_ms(R, PLAN_MS, 40.0, cost_ms=COST_MS) < started - 10.0


def test_the_prediction_counts_the_new_context_in_the_load() -> None:
    """With contexts running, r is asked at the load with the new one added:
    the r its first hint will plan with once it runs."""
    clock = ManualClock(0.0)
    voice = PlannedVoice(clock)
    voice.info = VoiceInfo(name="planned:v", family="planned", sample_rate=22050,
                           parallel_segments=2)
    core = SpeechCore({voice.info.name: voice}, clock=clock)  # type: ignore[dict-item]
    stats = core.stats_for(voice.info.name)
    stats.rtf.observe(0.2, 1.0, now=0.0, load=2)  # r 0.2 with 2 contexts on 2 workers
    start = Start(context="c", format="pcm_s16le", sample_rate=24000)
    core.load.active = 2
    at_3 = core.predicted_first_heard_ms(start)
    chars = min(core.segmenter_config.limit(0), FIRST_SEGMENT_CHARS)
    first_ms = chars * stats.audio_ms_per_char
    # one sentence-sized first chunk at r 0.2 * 3/2 (3 contexts on 2 workers)
    assert at_3 == pytest.approx(0.3 * first_ms)
    core.load.active = 1
    assert core.predicted_first_heard_ms(start) == pytest.approx(0.2 * first_ms)


async def warm_core() -> tuple[ManualClock, PlannedVoice, SpeechCore, Start]:
    """A core whose voice has spoken once (measured), and a start to ask about."""
    clock = ManualClock(50.0)
    voice = PlannedVoice(clock)
    core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock)
    await speak_one(core, clock, "warm")
    return clock, voice, core, Start(context="x", **OPUS)  # type: ignore[arg-type]


async def test_the_first_hint_covers_the_starts_queued_ahead_of_it() -> None:
    """Contexts starting now (opened, no audio yet) make their first chunks
    first: a new context's first hint asks for that much more audio, in
    proportion to how many there are, and admission predicts the wait."""
    clock, _, core, start = await warm_core()

    async def first_hint(name: str) -> BufferHint:
        sink = await speak_one(core, clock, name)
        return next(e for e in sink.events if isinstance(e, BufferHint))

    alone_hint, alone_heard = await first_hint("a"), core.predicted_first_heard_ms(start)
    burst = []
    deltas = []
    for n in (1, 4):
        while len(burst) < n:  # a burst: opened, their text not yet spoken
            burst.append(core.open(Start(context=f"o{len(burst)}", **OPUS),  # type: ignore[arg-type]
                                   TimedSink(clock)))
        predicted = core.predicted_first_heard_ms(start)
        hint = await first_hint(f"b{n}")
        deltas.append((hint.prebuffer_ms - alone_hint.prebuffer_ms, predicted - alone_heard))
    (hint1, heard1), (hint4, heard4) = deltas
    assert hint1 > 5.0 and hint4 == pytest.approx(4 * hint1, rel=0.05)
    assert heard1 > 5.0 and heard4 == pytest.approx(4 * heard1, rel=0.05)
    for ctx in burst:  # their first audio out (or gone): nothing is ahead any more
        ctx.release()
    assert (await first_hint("c")).prebuffer_ms == pytest.approx(alone_hint.prebuffer_ms)


async def test_starts_elsewhere_count_as_the_starts_here_do() -> None:
    """A voice behind a GPU worker: starts that other front ends queued there
    (``ServerLoad.starting_elsewhere``) raise a first hint and the predicted
    first heard audio exactly as as many starts in this process do, added
    to them; another voice's count is its own."""
    clock, voice, core, start = await warm_core()
    elsewhere = {voice.info.name: 0}
    core.load.starting_elsewhere = lambda name: elsewhere.get(name, 0)

    async def first_hint(name: str) -> float:
        sink = await speak_one(core, clock, name)
        return next(e for e in sink.events if isinstance(e, BufferHint)).prebuffer_ms

    alone = (await first_hint("a"), core.predicted_first_heard_ms(start))
    here = [core.open(Start(context=f"o{i}", **OPUS), TimedSink(clock))  # type: ignore[arg-type]
            for i in range(3)]
    three_here = (core.predicted_first_heard_ms(start), await first_hint("b"))
    for ctx in here[1:]:
        ctx.release()
    elsewhere[voice.info.name] = 2  # one here, two in other front ends
    assert core.load.starting_ahead(voice.info.name, clock.now()) == 3
    assert core.load.starting_ahead("other:v", clock.now()) == 1
    mixed = (core.predicted_first_heard_ms(start), await first_hint("c"))
    assert three_here[0] > alone[1] + 5.0 and three_here[1] > alone[0] + 5.0
    assert mixed == pytest.approx(three_here)
    here[0].release()
    elsewhere[voice.info.name] = 0  # the others' first audio is out
    assert await first_hint("d") == pytest.approx(alone[0])


async def test_a_batching_engine_s_starts_share_its_rows() -> None:
    """A voice on a batching engine (``batch_rows``) makes the first chunks of
    contexts starting together in one batch: four starts ahead of a context on
    an 8-row engine add half of what one start adds to a voice that makes one
    first chunk at a time, where they add four times that."""
    clock, voice, core, start = await warm_core()

    async def first_hint(name: str) -> float:
        sink = await speak_one(core, clock, name)
        return next(e for e in sink.events if isinstance(e, BufferHint)).prebuffer_ms

    async def hint_and_prediction(name: str) -> tuple[float, float]:
        predicted = core.predicted_first_heard_ms(start)  # before its text: starts count
        return await first_hint(name), predicted

    alone = await hint_and_prediction("a")
    ahead = [core.open(Start(context=f"o{i}", **OPUS), TimedSink(clock))  # type: ignore[arg-type]
             for i in range(4)]
    one_lane = await hint_and_prediction("b")
    for ctx in ahead:  # the same four opened again: each counts for STARTING_WINDOW_S
        ctx.release()
    ahead = [core.open(Start(context=f"p{i}", **OPUS), TimedSink(clock))  # type: ignore[arg-type]
             for i in range(4)]
    voice.info = dataclasses.replace(voice.info, batch_rows=8)
    batched = await hint_and_prediction("c")
    for one, many, none in zip(one_lane, batched, alone, strict=True):
        assert one - none > 5.0  # four first chunks queued ahead, one after another
        assert many - none == pytest.approx((one - none) / 8, rel=0.05)
    for ctx in ahead:
        ctx.release()
    assert await first_hint("d") == pytest.approx(alone[0])


async def test_a_fresh_front_end_plans_with_the_worker_s_r_until_it_measures_its_own() -> None:
    """A voice this process has not measured yet, whose engine another
    process measured (a GPU worker, over the other front ends' requests:
    ``SpeechCore.rtf_elsewhere``), gets the first hint and the predicted
    first heard audio of a process that measured that r itself, not
    ``default_rtf``'s; once it has measured its own, that r plans."""
    clock, voice, warm, start = await warm_core()
    hints = warm.hint_config
    shared = warm.stats_for(voice.info.name).rtf_estimate(hints.percentile, clock.now())
    # a default far off what the voice runs at (Orpheus on an H100: 0.5 against 0.32)
    far_off = dataclasses.replace(hints, default_rtf=1.0)
    assert shared < far_off.default_rtf / 4

    async def first_hint(core: SpeechCore, name: str) -> float:
        sink = await speak_one(core, clock, name)
        return next(e for e in sink.events if isinstance(e, BufferHint)).prebuffer_ms

    def fresh(elsewhere: float | None) -> SpeechCore:
        core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                          segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock,
                          hint_config=far_off)
        core.rtf_elsewhere = lambda name: elsewhere if name == voice.info.name else None
        return core

    measured = (warm.predicted_first_heard_ms(start), await first_hint(warm, "a"))
    told = fresh(shared)
    assert (told.predicted_first_heard_ms(start), await first_hint(told, "b")) == \
        pytest.approx(measured)
    blind = fresh(None)
    assert blind.predicted_first_heard_ms(start) == 0.0  # nothing to refuse on
    assert await first_hint(blind, "c") > measured[1] + 20.0  # default_rtf's hint
    # told's own segment is measured now: a worker's r far off no longer plans
    told.rtf_elsewhere = lambda name: 5.0
    assert await first_hint(told, "d") == pytest.approx(measured[1])
