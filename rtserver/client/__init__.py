"""rtserver's Python SDK: the async client of the streaming protocol (PROTOCOL.md, v1).

What chatbot backends import (and the benchmark, the Pipecat and LiveKit
plugins use)::

    async with RtClient.connect("ws://127.0.0.1:8080/v1/stream") as client:
        ctx = await client.start(voice=None)          # waits for `started`
        for token in llm_tokens:
            await ctx.send_text(token)
        await ctx.end()
        async for event in ctx.events():               # typed events, in order
            if isinstance(event, AudioFrames):
                play(event.frames)

One reader task per connection reads every message and hands it to the queue
of its context (a connection may hold several contexts at once). Errors that
name no open context go to ``client.errors`` (and to ``on_error``). The reader
stamps every message with ``clock()`` on arrival (``time.monotonic`` unless
injected), so receive times do not include how late a consumer reads its queue.

Queues are unbounded: the client always reads the socket, so a slow consumer
costs memory here instead of slowing the server (PROTOCOL.md, backpressure).

Messages are read and written by ``rtserver.protocol`` (``parse_server_message``,
``encode_client_message``, ``decode_audio_message``): the same typed messages
the server encodes. This package keeps the connection (``connection``), the
contexts (``context``, ``events``), the helpers (``helpers``, ``decode``: pure,
frames to PCM); ``SeqTracker`` (``rtserver.protocol.wire``) checks each
context's frame order. Import everything from ``rtserver.client``.

Helpers: ``send_tokens(ctx, tokens)`` pipes a token stream (sync or async)
into a context and ends it; ``openai_text(stream)`` yields the text of an
OpenAI-style chat completion stream; ``report_played(ctx, heard_ms)`` sends
``played`` while the listener hears the audio; ``word_times`` places a
segment's words within its audio (the server's ``words`` events do it
better: ``ContextStream.words``, ``ContextResult.word_spans``, each event's
``timing`` "model" or "estimated"); ``say_sync`` is the blocking one-liner::

    reply = await llm.chat.completions.create(model=m, messages=msgs, stream=True)
    async with RtClient.connect(url) as client:
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        sender = asyncio.create_task(send_tokens(ctx, openai_text(reply)))
        reporter = asyncio.create_task(report_played(ctx, lambda: player.heard_ms))
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                player.play(event.frames)
"""

from __future__ import annotations

from rtserver.client.connection import RtClient, say_sync
from rtserver.client.context import TERMINAL_ERROR_CODES, ContextStream
from rtserver.client.decode import decode_frames
from rtserver.client.errors import ConnectionLost, HandshakeRejected, ServerError
from rtserver.client.events import AudioFrames, ContextResult, ContextTimes, Event
from rtserver.client.helpers import openai_text, report_played, send_tokens, word_times
from rtserver.errors import ProtocolViolation, RtClientError, SeqGapError
from rtserver.protocol.messages import LexiconEntry, Words, WordSpan, parse_server_message
from rtserver.protocol.wire import SeqTracker

__all__ = [
    "TERMINAL_ERROR_CODES",
    "AudioFrames",
    "ConnectionLost",
    "ContextResult",
    "ContextStream",
    "ContextTimes",
    "Event",
    "HandshakeRejected",
    "LexiconEntry",
    "ProtocolViolation",
    "RtClient",
    "RtClientError",
    "SeqGapError",
    "SeqTracker",
    "ServerError",
    "WordSpan",
    "Words",
    "decode_frames",
    "openai_text",
    "parse_server_message",
    "report_played",
    "say_sync",
    "send_tokens",
    "word_times",
]
