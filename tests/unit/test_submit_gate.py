"""``engine.submit_gate``: later segments held and let go together."""

from __future__ import annotations

import asyncio

import pytest

from rtserver.engine.submit_gate import SubmitGate


async def turn() -> None:
    """Let every ready task run once (no time passes)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_an_urgent_request_lets_the_held_ones_go_with_it() -> None:
    gate = SubmitGate(hold_s=60.0)  # the timer never fires in this test
    held = [asyncio.create_task(gate.wait(urgent=False)) for _ in range(3)]
    await turn()
    assert not any(t.done() for t in held) and gate.held == 3
    await asyncio.wait_for(gate.wait(urgent=True), 5)  # never waits itself
    await asyncio.wait_for(asyncio.gather(*held), 5)
    assert gate.releases == 1
    later = asyncio.create_task(gate.wait(urgent=False))  # a new batch after the release
    await turn()
    assert not later.done()
    gate.release()
    await asyncio.wait_for(later, 5)


async def test_the_oldest_held_request_goes_after_the_hold() -> None:
    # long enough that the two checks before it never see it end (they take a few
    # turns of the loop), short enough for a unit test
    gate = SubmitGate(hold_s=0.5)
    first = asyncio.create_task(gate.wait(urgent=False))
    await turn()
    second = asyncio.create_task(gate.wait(urgent=False))
    await turn()
    assert not first.done() and not second.done()
    await asyncio.wait_for(asyncio.gather(first, second), 5)  # one timer, one batch
    assert gate.held == 2 and gate.releases == 1


async def test_a_cancelled_request_holds_no_one_up() -> None:
    gate = SubmitGate(hold_s=60.0)
    gone = asyncio.create_task(gate.wait(urgent=False))
    kept = asyncio.create_task(gate.wait(urgent=False))
    await turn()
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await gate.wait(urgent=True)
    await asyncio.wait_for(kept, 5)


async def test_a_hold_of_zero_lets_everything_through() -> None:
    gate = SubmitGate(hold_s=0.0)
    await asyncio.wait_for(gate.wait(urgent=False), 5)
    assert gate.held == 0 and gate.releases == 0
