"""The per-connection send queue: merging, fencing, backpressure (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from rtserver.clock import ManualClock
from rtserver.core.events import AudioFrames, Ledger
from rtserver.protocol.messages import Cancelled, ErrorMessage
from rtserver.server.outbox import ControlItem, Outbox


def ledger(name: str) -> Ledger:
    return Ledger(context=name, stream=1, frame_ms=20, clock=ManualClock())


async def put(box: Outbox, ledger: Ledger, frames: list[bytes], *, segment_start: bool,
              last: bool) -> int:
    """Number the frames as the core does and put them."""
    seq = ledger.next_seq
    ledger.next_seq += len(frames)
    await box.audio(AudioFrames(ledger, seq, tuple(frames), segment_start, last))
    return seq


async def test_consecutive_audio_of_one_context_is_merged_up_to_a_segment_start() -> None:
    box = Outbox(capacity_ms=10_000)
    a = ledger("a")
    await put(box, a, [b"1", b"2"], segment_start=True, last=False)
    await put(box, a, [b"3"], segment_start=False, last=False)
    await put(box, a, [b"4"], segment_start=True, last=False)  # new segment: own message
    await put(box, a, [b"5"], segment_start=False, last=True)
    first = await box.get_batch(max_frames=50)
    second = await box.get_batch(max_frames=50)
    assert isinstance(first, AudioFrames) and isinstance(second, AudioFrames)
    assert (first.seq, first.frames, first.segment_start, first.last) == \
        (0, (b"1", b"2", b"3"), True, False)
    assert (second.seq, second.frames, second.segment_start, second.last) == \
        (3, (b"4", b"5"), True, True)
    assert box.queued_ms == 0


async def test_merging_respects_the_frame_cap_and_other_contexts() -> None:
    box = Outbox(capacity_ms=10_000)
    a, b = ledger("a"), ledger("b")
    await put(box, a, [b"a0", b"a1"], segment_start=True, last=False)
    await put(box, b, [b"b0"], segment_start=True, last=False)
    await put(box, a, [b"a2"], segment_start=False, last=False)
    items = [await box.get_batch(max_frames=2) for _ in range(3)]
    assert [(i.ledger.context, i.frames) for i in items if isinstance(i, AudioFrames)] == \
        [("a", (b"a0", b"a1")), ("b", (b"b0",)), ("a", (b"a2",))]


async def test_purge_drops_only_that_context_and_urgent_goes_first() -> None:
    box = Outbox(capacity_ms=10_000)
    a, b = ledger("a"), ledger("b")
    await put(box, a, [b"a0"] * 5, segment_start=True, last=False)
    await put(box, b, [b"b0"], segment_start=True, last=False)
    box.put_control(ErrorMessage(code="x", message="y", context="a"), "a")
    assert box.purge("a") == 5
    box.put_control(Cancelled(context="a", last_seq=-1), urgent=True)
    first = await box.get_batch(50)
    second = await box.get_batch(50)
    assert isinstance(first, ControlItem) and isinstance(first.message, Cancelled)
    assert isinstance(second, AudioFrames) and second.ledger is b
    assert len(box) == 0 and box.queued_ms == 0


async def test_a_full_queue_makes_the_producer_wait_until_the_writer_drains() -> None:
    box = Outbox(capacity_ms=100)
    a = ledger("a")
    await put(box, a, [b"x"] * 5, segment_start=True, last=False)  # 100 ms: full
    blocked = asyncio.create_task(put(box, a, [b"y"], segment_start=False, last=False))
    await asyncio.sleep(0)
    assert not blocked.done()
    await box.get_batch(50)
    assert await asyncio.wait_for(blocked, 1) == 5  # its first seq
    box.close()
    with pytest.raises(ConnectionError):
        await put(box, a, [b"z"], segment_start=False, last=False)
