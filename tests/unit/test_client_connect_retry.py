"""The SDK tries a connection again when the server dropped it unanswered.

Several processes on one port (``--workers``, SO_REUSEPORT): a process that
starts draining stops listening, and Linux drops the connections still queued
for its listener (unless ``net.ipv4.tcp_migrate_req`` is 1). Nothing of such a
connection was served, so the client connects again. A real loopback TCP
front drops the first connections, then forwards to a websockets server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidMessage

from rtserver.client import RtClient

READY = json.dumps({"type": "ready", "protocol": 1, "server": "s", "voices": ["v"],
                    "limits": {"max_message_bytes": 1, "max_text_chars": 2,
                               "max_contexts": 3}})


async def _ready(ws: ServerConnection) -> None:
    await ws.send(READY)
    await ws.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


class DroppingFront:
    """Closes the first ``drop`` connections before reading anything."""

    def __init__(self, drop: int, backend_port: int) -> None:
        self.drop = drop
        self.backend_port = backend_port
        self.seen = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.seen += 1
        if self.seen <= self.drop:
            writer.close()
            return
        b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        await asyncio.gather(_pipe(reader, b_writer), _pipe(b_reader, writer))


async def _front(drop: int) -> AsyncIterator[tuple[str, DroppingFront]]:
    async with serve(_ready, "127.0.0.1", 0) as backend:
        port = backend.sockets[0].getsockname()[1] if backend.sockets else 0
        front = DroppingFront(drop, port)
        server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
        async with server:
            url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/stream"
            yield url, front


async def test_a_connection_dropped_before_any_answer_is_tried_again() -> None:
    async for url, front in _front(drop=2):
        client = await RtClient.connect(url, connect_retries=2)
        assert client.ready.voices == ("v",)
        assert front.seen == 3
        await client.close()


async def test_retries_are_bounded_and_then_the_error_is_raised() -> None:
    async for url, front in _front(drop=5):
        with pytest.raises(InvalidMessage):
            await RtClient.connect(url, connect_retries=1)
        assert front.seen == 2
    with pytest.raises(ValueError):
        RtClient.connect("ws://127.0.0.1:1/", connect_retries=-1)
