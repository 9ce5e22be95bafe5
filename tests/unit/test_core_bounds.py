"""Every queue of a context is bounded, and what happens at the bound is
said: the input takes at most ``max_text_chars`` (``text_too_long``, nothing
of the fragment kept), the segment queue makes its producer wait."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rtserver.clock import ManualClock
from rtserver.config import ServerConfig
from rtserver.core import SpeechCore
from rtserver.core.inputs import DEFAULT_MAX_TEXT_CHARS, ContextInput, InputKind
from rtserver.core.segments import SegmentQueue
from rtserver.errors import TextTooLong
from rtserver.protocol.messages import Done, SegmentStarted, Start
from rtserver.text.segmenter import Segment, SegmenterConfig
from tests.unit.test_core_guarantees import PCM, FakeVoice, RecordingSink


def test_a_core_without_a_config_takes_what_the_server_config_takes() -> None:
    assert DEFAULT_MAX_TEXT_CHARS == ServerConfig().max_text_chars


async def test_input_past_max_chars_is_text_too_long_and_keeps_nothing_of_it() -> None:
    inputs = ContextInput("c", ManualClock(), max_chars=10)
    inputs.feed("Hello ")
    with pytest.raises(TextTooLong) as info:
        inputs.feed("there!")  # 12 in all
    assert info.value.code.value == "text_too_long" and info.value.context == "c"
    assert inputs.chars_in == 6 and len(inputs) == 1
    inputs.feed("ther")  # exactly 10 fits
    assert inputs.chars_in == 10
    taken = [await inputs.next(0.0), await inputs.next(0.0)]
    assert [i.text for i in taken if i is not None] == ["Hello ", "ther"]


async def test_input_items_are_bounded_by_the_text() -> None:
    """Flushes with nothing between, empty fragments and wake-ups add no items."""
    inputs = ContextInput("c", ManualClock(), max_chars=100)
    for _ in range(1000):
        inputs.feed("")
        inputs.flush()
        inputs.wake()
    assert len(inputs) == 1
    inputs.feed("a")
    inputs.flush()
    inputs.end()
    kinds = []
    while len(inputs):
        item = await inputs.next(0.0)
        assert item is not None
        kinds.append(item.kind)
    assert kinds == [InputKind.FLUSH, InputKind.TEXT, InputKind.FLUSH, InputKind.END]
    assert await inputs.next(0.0) is None  # the pending wake-up, once
    with pytest.raises(ValueError, match="after end"):
        inputs.feed("more")


def _seg(index: int, text: str) -> Segment:
    return Segment(index=index, text=text, source=(0, len(text)))


async def test_a_full_segment_queue_makes_its_producer_wait() -> None:
    idle: list[bool] = []
    queue = SegmentQueue(capacity_chars=10, on_idle=lambda: idle.append(True))
    await queue.put(_seg(0, "Hello."))
    put = asyncio.create_task(queue.put(_seg(1, "There.")))  # 12 chars: waits
    await asyncio.sleep(0)
    assert not put.done() and len(queue) == 1 and queue.queued_chars == 6
    assert (await queue.get()) == _seg(0, "Hello.")
    await asyncio.wait_for(put, 1.0)
    assert queue.queued_chars == 6 and queue.busy and not idle
    long = "A segment longer than the whole capacity."
    big = asyncio.create_task(queue.put(_seg(2, long)))  # waits for an empty queue ...
    await asyncio.sleep(0)
    assert not big.done()
    assert (await queue.get()).index == 1
    await asyncio.wait_for(big, 1.0)  # ... where a segment alone always fits
    assert queue.queued_chars == len(long)
    assert (await queue.get()).index == 2
    await queue.put(None)
    assert await queue.get() is None and not queue.busy


async def test_a_context_refuses_text_past_its_limit_and_speaks_what_it_took() -> None:
    clock = ManualClock()
    voice = FakeVoice(clock)
    core = SpeechCore({voice.info.name: voice},  # type: ignore[dict-item]
                      segmenter_config=SegmenterConfig(first_wait_s=0), clock=clock,
                      max_text_chars=20)
    sink = RecordingSink()
    ctx = core.open(Start(context="c", **PCM), sink)  # type: ignore[arg-type]
    ctx.feed("Hello there. ")
    with pytest.raises(TextTooLong):
        ctx.feed("How are you today?")
    ctx.end()
    assert await ctx.run() == "done"
    assert [e.text for e in sink.events if isinstance(e, SegmentStarted)] == ["Hello there."]
    assert isinstance(sink.events[-1], Done)


def test_the_server_passes_its_limit_to_the_core() -> None:
    """``[server] max_text_chars`` is the core's bound, not the default."""
    from rtserver.config import Config
    from rtserver.server.state import AppState

    clock = ManualClock()
    voice = FakeVoice(clock)
    config = dataclasses.replace(Config(), server=dataclasses.replace(
        ServerConfig(), max_text_chars=123))
    app = AppState(config=config, voices={voice.info.name: voice},  # type: ignore[dict-item]
                   default_voice=voice.info.name)
    assert app.core.max_text_chars == 123
