"""Every bad input gets its PROTOCOL error code; the connection keeps working."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtserver.protocol.messages import Done, ErrorMessage, Ready, Started, parse_server_message
from rtserver.testing.server_thread import ServerThread

from .util import recv_message, until


async def expect_error(ws: ClientConnection, code: str) -> ErrorMessage:
    err = await until(ws, ErrorMessage)
    assert err.code == code, err
    assert err.message
    return err


BAD = [
    ("not json at all", "bad_message"),
    (json.dumps({"type": "sing", "context": "x"}), "bad_message"),
    (json.dumps({"type": "text", "context": "x"}), "bad_message"),
    (json.dumps({"type": "start", "context": 12}), "bad_message"),
    (json.dumps({"type": "text", "context": "nobody", "text": "hi"}), "unknown_context"),
    (json.dumps({"type": "start", "context": "x", "format": "mp3"}), "unsupported_format"),
    (json.dumps({"type": "start", "context": "x", "sample_rate": 44100}), "unsupported_format"),
    (json.dumps({"type": "start", "context": "x", "frame_ms": 30}), "unsupported_format"),
    (json.dumps({"type": "start", "context": "x", "voice": "nobody"}), "unknown_voice"),
]


async def test_every_bad_input_gets_its_code_and_the_connection_lives(
        server: ServerThread) -> None:
    async with connect(server.url, compression=None) as ws:
        ready = await recv_message(ws)
        assert isinstance(ready, Ready)
        await ws.send(json.dumps({"type": "start", "context": "good"}))
        assert isinstance(await recv_message(ws), Started)
        for raw, code in BAD:
            await ws.send(raw)
            await expect_error(ws, code)
        await ws.send(b"\x00binary")
        await expect_error(ws, "bad_message")
        await ws.send(json.dumps({"type": "start", "context": "good"}))
        await expect_error(ws, "duplicate_context")
        limit = ready.limits.max_contexts
        for i in range(limit - 1):
            await ws.send(json.dumps({"type": "start", "context": f"extra{i}"}))
        await ws.send(json.dumps({"type": "start", "context": "one-too-many"}))
        await expect_error(ws, "too_many_contexts")
        # the first context still speaks
        await ws.send(json.dumps({"type": "text", "context": "good", "text": "Still fine."}))
        await ws.send(json.dumps({"type": "end", "context": "good"}))
        frames = 0
        while True:
            data = await ws.recv()
            if isinstance(data, bytes):
                frames += 1
                continue
            msg = parse_server_message(data)
            if isinstance(msg, Done) and msg.context == "good":
                break
        assert frames > 0


async def test_text_over_the_limit() -> None:
    srv = ServerThread.with_settings(server={"max_text_chars": 20}).start()
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            await ws.send(json.dumps({"type": "start", "context": "c"}))
            await until(ws, Started)
            await ws.send(json.dumps({"type": "text", "context": "c", "text": "x" * 21}))
            err = await expect_error(ws, "text_too_long")
            assert err.context == "c"
    finally:
        srv.stop()


async def test_message_over_max_bytes_closes_1009(server: ServerThread) -> None:
    async with connect(server.url, compression=None, max_size=None) as ws:
        ready = await until(ws, Ready)
        big = "x" * (ready.limits.max_message_bytes + 1)
        await ws.send(json.dumps({"type": "text", "context": "c", "text": big}))
        with pytest.raises(ConnectionClosed):
            while True:
                await ws.recv()
        assert ws.close_code == 1009
