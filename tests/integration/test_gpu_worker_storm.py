"""A start storm spread over front ends: ``rtserver serve`` with a GPU worker
(tiny ChatTTS on the CPU, one engine row) and two front ends on one port.

What a user would check: contexts whose first segments wait in the worker
for their first output, started through one front end, raise the first
``buffer`` hint of a context started through the other front end (which
sees none of them in its own process), and that front end's /metrics shows
them; once they are gone, its first hint is what it was alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("pybase16384")

from rtserver.client import ContextStream, RtClient
from rtserver.protocol.messages import BufferHint
from tests.integration.test_gpu_worker_server import (
    Split,
    first_audio,
    first_event,
    front_of,
    until,
)

pytestmark = pytest.mark.slow

# Contexts of the storm, started through front end 0.
STORM = 4


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    # One engine row, held by a segment of 60 s of audio (about 2,800 steps,
    # far longer than the test) while the storm's first segments wait for it;
    # the worker takes 8 requests, so it refuses none of them.
    srv = Split(tmp_path_factory.mktemp("storm"), slots=1, max_len=3072, budget_s=60.0,
                gpu="max_requests = 8\n")
    try:
        srv.wait_for(r"3 of 3 workers ready")
        yield srv
    finally:
        srv.close()


async def first_hint(client: RtClient, text: str = "Hello there.") -> tuple[ContextStream,
                                                                               BufferHint]:
    """A context that was sent its whole text, and its first ``buffer`` hint."""
    return await first_event(client, text, BufferHint)


async def test_a_storm_through_one_front_end_raises_the_first_hint_of_another(
        split: Split) -> None:
    clients = [await RtClient.connect(split.url) for _ in range(16)]
    try:
        by_front = {front_of(c)[0]: c for c in clients}
        assert len(by_front) == 2, "the kernel spread 16 connections over one front end"
        storm_front, witness = by_front[0], by_front[1]
        # alone: the witness's first hint, its context stopped before its
        # segment ends (no measurement changes the voice's r)
        ctx, alone = await first_hint(witness)
        await ctx.cancel()
        await until(lambda: split.held(1) == 0, within=10)
        # the storm: one context holds the engine's row; STORM more wait for it
        held = await first_audio(storm_front)
        storm = [(await first_hint(storm_front))[0] for _ in range(STORM)]
        await until(lambda: split.starting(None) == STORM, within=10)
        await until(lambda: split.starting(1) == STORM, within=5)  # the witness heard
        ctx, during = await first_hint(witness)
        await ctx.cancel()
        assert during.rtf == alone.rtf  # the same r: only the starts ahead differ
        assert during.prebuffer_ms > alone.prebuffer_ms + 1.0, (alone, during)
        # the storm gone (cancelled): the witness's first hint is as alone
        for c in [held, *storm]:
            await c.cancel()
        # (the worker frees a request cancelled before it ran, too)
        await until(lambda: split.starting(1) == 0 and split.held(1) == 0, within=10)
        ctx, after = await first_hint(witness)
        await ctx.cancel()
        assert after.rtf == alone.rtf and after.prebuffer_ms == alone.prebuffer_ms
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
