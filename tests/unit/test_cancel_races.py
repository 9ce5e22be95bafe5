"""A cancel that lands in the tick a wait ends is never lost.

On Python 3.11 ``asyncio.wait_for`` returns the inner result and drops the
caller's cancel when both land in one tick (cpython#86296). A context
cancelled as its text arrived then went on waiting for input in its segment
loop, and its connection's reader, waiting for the context to end, read no
more: the whole connection hung (seen under a barge-in stress on 2 cores).
"""

from __future__ import annotations

import asyncio

import pytest

from rtserver.clock import ManualClock
from rtserver.core.inputs import ContextInput


@pytest.mark.parametrize("timeout_s", [None, 5.0])
@pytest.mark.parametrize("ticks", range(6))
async def test_a_cancel_as_input_arrives_ends_the_waiting_task(ticks: int,
                                                              timeout_s: float | None) -> None:
    inputs = ContextInput("c", ManualClock(), max_chars=100)

    async def segment_loop() -> None:
        while True:  # as SegmentLoop.run: waits again unless cancelled
            await inputs.next(timeout_s)

    task = asyncio.create_task(segment_loop())
    for _ in range(3):
        await asyncio.sleep(0)  # waiting for input
    inputs.feed("Hello")
    for _ in range(ticks):  # the cancel lands this many ticks after the input
        await asyncio.sleep(0)
    assert task.cancel()
    done, _ = await asyncio.wait([task], timeout=2)
    assert done, f"the cancel {ticks} tick(s) after the input was lost: the task waits on"
    assert task.cancelled()
