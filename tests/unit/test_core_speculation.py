"""The speculative first segment (``core/speculation.py``): a context starts
synthesizing its first segment when white space would cut it, before the
next fragment confirms the cut; what a listener gets is exactly what it got
without the guess, the voice's work on a wrong guess is stopped, and a
context that ends or is cancelled leaves no synthesis running.

Each segment's audio is a constant level chosen by its text, so the frames
say which synthesis they came from."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncGenerator

import numpy as np
from test_core_guarantees import RecordingSink, audio_of

from rtserver.audio.pcm import PcmChunk
from rtserver.core import SpeechContext, SpeechCore
from rtserver.core.speaker import MAX_GUESSES
from rtserver.protocol.messages import Done, Start
from rtserver.testing.wait import wait_until_async
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import SynthesisRequest, VoiceInfo

RATE = 24000
START = Start(context="c", format="pcm_s16le", sample_rate=RATE, frame_ms=20)
CHUNK = RATE // 50  # one 20 ms frame a chunk


def level(text: str) -> int:
    """The int16 sample value of ``text``'s audio (a multiple of 8: the float
    to int16 conversion may round it by one)."""
    return 8 * (13 + zlib.crc32(text.encode()) % 2500)


class LevelVoice:
    """Two frames of ``level(text)`` a segment; ``gate`` holds the second.
    Records what it was asked for and which requests it closed."""

    def __init__(self) -> None:
        self.info = VoiceInfo(name="level", family="test", sample_rate=RATE)
        self.started: list[str] = []
        self.closed: list[str] = []
        self.gate = asyncio.Event()

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        self.started.append(request.text)
        samples = np.full(CHUNK, level(request.text) / 32767.0, np.float32)
        try:
            yield PcmChunk(samples, RATE)
            await self.gate.wait()
            yield PcmChunk(samples, RATE)
        finally:
            self.closed.append(request.text)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None


def levels_heard(events: list[object]) -> list[int]:
    """The level of each frame the sink got, in order."""
    out = []
    for ev in audio_of(events):
        for frame in ev.frames:
            pcm = np.frombuffer(frame, np.int16)
            assert (pcm == pcm[0]).all()
            out.append(8 * round(int(pcm[0]) / 8))
    return out


def guesses(core: SpeechCore, outcome: str) -> float:
    value = core.metrics.registry.get_sample_value(
        "rtserver_first_segment_speculations_total", {"voice": "level", "outcome": outcome})
    return value or 0.0


def make(first_max_words: int = 3, speculate: bool = True
         ) -> tuple[LevelVoice, SpeechCore, RecordingSink]:
    voice = LevelVoice()
    core = SpeechCore({"level": voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_max_words=first_max_words,
                                                       speculate_first=speculate))
    return voice, core, RecordingSink()


async def guessed(voice: LevelVoice, ctx: SpeechContext, text: str) -> None:
    """Feed ``text`` and wait until the voice is asked for it (the guess)."""
    ctx.feed(text)
    await wait_until_async(lambda: voice.started[-1:] == [text], f"a guess of {text!r}")


async def test_a_confirmed_guess_is_spoken_before_the_cut_and_heard_once() -> None:
    voice, core, sink = make()
    ctx = core.open(START, sink)
    async with asyncio.TaskGroup() as group:
        run = group.create_task(ctx.run())
        await guessed(voice, ctx, "One two three")  # before any space
        assert levels_heard(sink.events) == []  # held until the cut confirms it
        ctx.feed(" four.")
        await wait_until_async(lambda: levels_heard(sink.events), "first audio")
        ctx.end()
        voice.gate.set()
        await run
    assert voice.started == ["One two three", "four."]  # the first one synthesis only
    assert levels_heard(sink.events) == [level("One two three")] * 2 + [level("four.")] * 2
    done = [e for e in sink.events if isinstance(e, Done)]
    assert done[0].spoken_text == "One two three four."
    assert guesses(core, "adopted") == 1 and guesses(core, "dropped") == 0


async def test_a_word_that_goes_on_drops_the_guess_and_nothing_of_it_is_heard() -> None:
    voice, core, sink = make()
    ctx = core.open(START, sink)
    async with asyncio.TaskGroup() as group:
        run = group.create_task(ctx.run())
        await guessed(voice, ctx, "One two won")
        ctx.feed("der")
        # the guess is stopped (its request closed) and the longer word guessed
        await wait_until_async(lambda: "One two won" in voice.closed, "the guess closed")
        await wait_until_async(lambda: voice.started[-1] == "One two wonder",
                               "the second guess started")
        ctx.feed(" why.")
        ctx.end()
        voice.gate.set()
        await run
    assert levels_heard(sink.events) == [level("One two wonder")] * 2 + [level("why.")] * 2
    assert guesses(core, "adopted") == 1 and guesses(core, "dropped") == 1
    assert sorted(voice.closed) == sorted(voice.started)  # every request was closed


async def test_a_word_arriving_letter_by_letter_costs_at_most_the_cap() -> None:
    voice, core, sink = make(first_max_words=2)
    ctx = core.open(START, sink)
    voice.gate.set()
    async with asyncio.TaskGroup() as group:
        run = group.create_task(ctx.run())
        ctx.feed("Hi")
        for ch in " wonderful":
            ctx.feed(ch)
        ctx.feed(" day.")
        ctx.end()
        await run
    early = voice.started[:-2]  # the rest: the cut segment and the last one
    assert len(early) <= MAX_GUESSES
    assert voice.started[-2:] == ["Hi wonderful", "day."]
    assert levels_heard(sink.events) == [level("Hi wonderful")] * 2 + [level("day.")] * 2
    assert sorted(voice.closed) == sorted(voice.started)


async def test_cancel_and_end_leave_no_guess_running() -> None:
    voice, core, sink = make()
    ctx = core.open(START, sink)
    task = asyncio.create_task(ctx.run())
    await guessed(voice, ctx, "One two three")
    await ctx.cancel()
    assert voice.closed == ["One two three"]  # stopped before cancelled was sent
    assert levels_heard(sink.events) == [] and task.done()

    voice, core, sink = make()
    ctx = core.open(START, sink)
    task = asyncio.create_task(ctx.run())
    await guessed(voice, ctx, "One two three")
    ctx.feed("-ish")  # not the guess; ends without a space
    ctx.end()
    voice.gate.set()
    await task
    assert voice.started == ["One two three", "One two three-ish"]
    assert voice.closed.count("One two three") == 1
    assert levels_heard(sink.events) == [level("One two three-ish")] * 2


async def test_off_waits_for_the_cut() -> None:
    voice, core, sink = make(speculate=False)
    ctx = core.open(START, sink)
    voice.gate.set()
    async with asyncio.TaskGroup() as group:
        run = group.create_task(ctx.run())
        ctx.feed("One two three")
        await wait_until_async(lambda: len(ctx.input) == 0, "the fragment read")
        ctx.feed(" four.")
        ctx.end()
        await run
    assert voice.started == ["One two three", "four."]
    assert guesses(core, "adopted") == 0 and guesses(core, "dropped") == 0
