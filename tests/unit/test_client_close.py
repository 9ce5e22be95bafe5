"""RtClient.close() never swallows the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from rtserver.client import RtClient
from rtserver.protocol.messages import Limits, Ready

READY = Ready(server="rtserver/test", voices=("piper:a",),
              limits=Limits(max_message_bytes=65536, max_text_chars=100, max_contexts=2))


class StuckSocket:
    """A socket whose peer never finishes the closing handshake."""

    close_code: int | None = None
    close_reason: str | None = None

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    async def close(self) -> None:
        return None

    def __aiter__(self) -> StuckSocket:
        return self

    async def __anext__(self) -> bytes:
        await self.ended.wait()
        raise StopAsyncIteration


async def test_cancelling_close_propagates_and_stops_the_reader() -> None:
    ws = StuckSocket()
    client = RtClient(ws, READY)  # type: ignore[arg-type]
    closing = asyncio.create_task(client.close())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not closing.done()  # waiting on the reader
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert closing.cancelled()
    await asyncio.sleep(0)
    assert client.closed  # the reader was cancelled with it, not left behind


async def test_close_returns_once_the_reader_ends() -> None:
    ws = StuckSocket()
    client = RtClient(ws, READY)  # type: ignore[arg-type]
    closing = asyncio.create_task(client.close())
    await asyncio.sleep(0)
    ws.ended.set()
    await asyncio.wait_for(closing, 5)
    assert client.closed
