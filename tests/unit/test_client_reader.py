"""RtClient reads a server's frames through ``rtserver.protocol``.

A scripted websockets server on loopback answers with the protocol's own
encoders, plus what a newer server may add (a message type, a field) and
what a broken one may send.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from websockets.asyncio.server import ServerConnection, serve

from rtserver.client import AudioFrames, ProtocolViolation, RtClient
from rtserver.protocol.messages import (
    Done,
    Limits,
    Ready,
    SegmentStarted,
    Start,
    Started,
    encode_server_message,
    parse_client_message,
)
from rtserver.protocol.wire import encode_audio_message

READY = Ready(server="scripted", voices=("v",), default_voice="v",
              limits=Limits(max_message_bytes=65536, max_text_chars=100, max_contexts=2))
PCM = b"\x00\x01" * 160  # one 20 ms frame at 8 kHz, s16le


def _with_extra(text: str, **extra: object) -> str:
    return json.dumps({**json.loads(text), **extra})


async def _serve(script: Callable[[ServerConnection, Start], Awaitable[None]]) -> Callable[
        [ServerConnection], Awaitable[None]]:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(encode_server_message(READY))
        first = await ws.recv()
        assert isinstance(first, str)
        start = parse_client_message(first)  # the server's parser reads the client's start
        assert isinstance(start, Start)
        await script(ws, start)
        await ws.wait_closed()
    return handler


async def test_unknown_types_and_fields_from_a_newer_server_are_skipped() -> None:
    """A message type and fields this client does not know change nothing it reports."""
    async def script(ws: ServerConnection, start: Start) -> None:
        await ws.send(encode_server_message(Started(
            context=start.context, stream=3, format=start.format,
            sample_rate=start.sample_rate, frame_ms=start.frame_ms, pre_skip=0)))
        await ws.send(json.dumps({"type": "visemes", "context": start.context, "segment": 0,
                                  "timing": "estimated", "visemes": []}))
        await ws.send(_with_extra(encode_server_message(SegmentStarted(
            context=start.context, index=0, text="Hi.", source=(0, 3), seq=0)),
            emotion="calm"))
        await ws.send(encode_audio_message(3, 0, [PCM], last=True, segment_start=True))
        await ws.send(encode_server_message(Done(
            context=start.context, frames=1, audio_ms=20.0, ttfa_ms=5.0)))

    async with serve(await _serve(script), "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with RtClient.connect(f"ws://127.0.0.1:{port}/v1/stream") as client:
            assert client.ready == READY
            ctx = await client.start("c", format="pcm_s16le", sample_rate=8000)
            events = [event async for event in ctx.events()]
            assert [type(e) for e in events] == [Started, SegmentStarted, AudioFrames, Done]
            assert events[1] == SegmentStarted(context="c", index=0, text="Hi.",
                                               source=(0, 3), seq=0)
            frames = events[2]
            assert isinstance(frames, AudioFrames) and frames.frames == (PCM,)
            assert ctx.done == Done(context="c", frames=1, audio_ms=20.0, ttfa_ms=5.0)
            assert client.errors.empty()


async def test_a_malformed_known_message_is_reported_and_the_context_goes_on() -> None:
    """A `buffer` with a mistyped field goes to ``client.errors``; the audio still comes."""
    async def script(ws: ServerConnection, start: Start) -> None:
        await ws.send(encode_server_message(Started(
            context=start.context, stream=0, format=start.format,
            sample_rate=start.sample_rate, frame_ms=start.frame_ms, pre_skip=0)))
        await ws.send(json.dumps({"type": "buffer", "context": start.context,
                                  "prebuffer_ms": "soon", "rtf": 0.5, "ahead_ms": 0}))
        await ws.send(encode_audio_message(0, 0, [PCM], last=True, segment_start=True))
        await ws.send(encode_server_message(Done(
            context=start.context, frames=1, audio_ms=20.0, ttfa_ms=None)))

    async with serve(await _serve(script), "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with RtClient.connect(f"ws://127.0.0.1:{port}/v1/stream") as client:
            ctx = await client.start("c", format="pcm_s16le", sample_rate=8000)
            result = await ctx.collect(decode=False)
            assert result.ok and result.frame_count == 1
            error = client.errors.get_nowait()
            assert isinstance(error, ProtocolViolation)
            assert "prebuffer_ms" in str(error)
