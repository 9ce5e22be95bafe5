"""The bench never hangs on a server that stops answering: a context with no
event within ``event_timeout_s`` fails ``EventTimeout`` (naming what it saw),
and the user's next turn opens a new connection."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from websockets.asyncio.server import ServerConnection, serve

from rtserver.client import RtClient
from rtserver.protocol.messages import (
    Limits,
    Ready,
    Start,
    Started,
    encode_server_message,
    parse_client_message,
)
from rtserver.testing.wait import scaled
from rtserver.tools.bench import loads
from rtserver.tools.bench.loads import EventTimeout, LoadConfig, RunState

READY = Ready(server="rtserver/test", voices=("piper:a",),
              limits=Limits(max_message_bytes=65536, max_text_chars=10000, max_contexts=4))


@asynccontextmanager
async def mute_server() -> AsyncIterator[tuple[str, list[int]]]:
    """A server that starts every context, reads its text, and then says nothing."""
    connections: list[int] = []

    async def handler(ws: ServerConnection) -> None:
        connections.append(len(connections))
        await ws.send(encode_server_message(READY))
        async for data in ws:
            msg = parse_client_message(str(data))
            if isinstance(msg, Start):
                await ws.send(encode_server_message(Started(
                    context=msg.context, stream=1, format=msg.format,
                    sample_rate=msg.sample_rate, frame_ms=msg.frame_ms)))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/stream", connections


async def test_a_silent_context_fails_with_what_it_saw_instead_of_hanging() -> None:
    cfg = LoadConfig(pattern="stream", tokens_per_s=400.0, event_timeout_s=0.5)
    async with mute_server() as (url, _):
        async with RtClient.connect(url) as client:
            plan = loads.plan_turn(cfg, random.Random(1), "stream")
            began = time.monotonic()
            sample = await asyncio.wait_for(loads.run_turn(client, plan, cfg), 10)
    assert time.monotonic() - began < 5
    assert sample["outcome"] == "failed"
    assert sample["error"] == "EventTimeout"
    msg = sample["error_message"]
    assert "no event for 0.5 s after Started" in msg and "0 frames" in msg
    assert f"{len(plan.fragments)} of {len(plan.fragments)} fragments sent, end sent" in msg


async def test_a_user_whose_context_timed_out_goes_on_with_a_new_connection() -> None:
    cfg = LoadConfig(pattern="stream", tokens_per_s=400.0, event_timeout_s=0.2)
    samples: list[dict[str, object]] = []
    async with mute_server() as (url, connections):
        state = RunState(emit=samples.append, labels={})
        # a turn takes ~0.4 s (its text at 400 fragments/s, then the timeout):
        # 2 s leave room for several, so a second turn comes on a slow machine too
        await asyncio.wait_for(loads.closed_loop(url, None, cfg, 1, scaled(2.0), "t", state),
                               scaled(20))
    timed_out = [s for s in samples if s.get("error") == EventTimeout.__name__]
    assert len(timed_out) >= 2 and len(timed_out) == len(samples)
    assert len(connections) == len(timed_out)  # each turn after a timeout: a new connection
