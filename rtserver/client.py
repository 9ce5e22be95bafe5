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
the server encodes. This module keeps the connection, the contexts and the
helpers; ``SeqTracker`` (``rtserver.protocol.wire``) checks each context's
frame order, and ``decode_frames`` (pure) turns frames into PCM.

Helpers: ``send_tokens(ctx, tokens)`` pipes a token stream (sync or async)
into a context and ends it; ``openai_text(stream)`` yields the text of an
OpenAI-style chat completion stream; ``report_played(ctx, heard_ms)`` sends
``played`` while the listener hears the audio; ``word_times`` places a
segment's words within its audio; ``say_sync`` is the blocking one-liner::

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

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Sequence,
)
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from rtserver.errors import ProtocolViolation, RtClientError, SeqGapError, UnknownMessageType
from rtserver.protocol.messages import (
    BufferHint,
    Cancel,
    Cancelled,
    ClientMessage,
    Done,
    End,
    ErrorMessage,
    Flush,
    Played,
    Ready,
    SegmentStarted,
    Start,
    Started,
    Text,
    encode_client_message,
    parse_server_message,
)
from rtserver.protocol.wire import AudioMessage, SeqTracker, decode_audio_message

Clock = Callable[[], float]
FloatArray = npt.NDArray[np.float32]

# Server messages are small (audio frames are tens of bytes to a few KiB);
# 16 MiB leaves room for a large `ready` or a many-frame binary message.
DEFAULT_MAX_SIZE = 16 * 1024 * 1024
OPUS_RATE = 48000  # `pre_skip` is counted at 48 kHz (PROTOCOL.md, `started`)
# Context errors after which the server sends nothing more for the context
# (the session ends it: engine failure, internal error, overload and close).
TERMINAL_ERROR_CODES = frozenset({"engine_failed", "internal", "overloaded"})
RECENT_CONTEXTS = 256  # finished contexts kept to route late `cancelled` replies


# --- errors ---------------------------------------------------------------------

class ServerError(RtClientError):
    """The server answered a request with `error`."""

    def __init__(self, error: ErrorMessage) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


class ConnectionLost(RtClientError):
    """The connection closed while a context was still open."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"connection closed (code {code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


class HandshakeRejected(RtClientError):
    """The server refused the WebSocket handshake (401 for a wrong API key)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"handshake rejected with HTTP {status}")
        self.status = status


# --- events -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AudioFrames(AudioMessage):
    """One binary message (``AudioMessage``: ``frames``, Opus packets or PCM
    s16le, from ``seq`` on) with the context its stream belongs to and the
    client's ``clock()`` when it arrived."""

    context: str
    received_at: float
    type: str = field(default="audio", init=False)

    @property
    def end_seq(self) -> int:
        """The seq after this message's last frame."""
        return self.seq + len(self.frames)


Event = Started | SegmentStarted | BufferHint | AudioFrames | Done | Cancelled | ErrorMessage


# --- decoding (pure) ----------------------------------------------------------------

def decode_frames(frames: Sequence[bytes], *, format: str, sample_rate: int, frame_ms: int,
                  pre_skip: int = 0) -> FloatArray:
    """Mono float32 PCM of a context's frames, in order.

    Opus: one libopus decoder at the stream rate; the encoder delay
    (``pre_skip`` samples at 48 kHz) is dropped from the start. PCM s16le is
    scaled to [-1, 1). The last frame's padding is kept (PROTOCOL.md: every
    frame lasts ``frame_ms``).
    """
    if format == "pcm_s16le":
        joined = b"".join(frames)
        return (np.frombuffer(joined, dtype="<i2").astype(np.float32) / 32768.0)
    if format != "opus":
        raise ValueError(f"unknown audio format '{format}'")
    import opuslib

    decoder = opuslib.Decoder(sample_rate, 1)
    frame_size = sample_rate * frame_ms // 1000
    parts = [np.frombuffer(decoder.decode_float(packet, frame_size), dtype=np.float32)
             for packet in frames]
    pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    skip = round(pre_skip * sample_rate / OPUS_RATE)
    return pcm[skip:].astype(np.float32, copy=False)


# --- per-context state ----------------------------------------------------------------

@dataclass(slots=True)
class ContextTimes:
    """Client-side timestamps of one context, all from the client's ``clock``.

    ``text_sent`` holds ``(time, start, end)``: when each text fragment was
    handed to the socket and the ``[start, end)`` character offsets it covers
    in the context's text (the offsets `segment.source` refers to).
    """

    start_sent_at: float | None = None
    started_at: float | None = None
    text_sent: list[tuple[float, int, int]] = field(default_factory=list)
    flush_sent_at: list[tuple[float, int]] = field(default_factory=list)  # (time, chars so far)
    end_sent_at: float | None = None
    cancel_sent_at: float | None = None
    segments: list[tuple[float, SegmentStarted]] = field(default_factory=list)
    buffer_hints: list[tuple[float, BufferHint]] = field(default_factory=list)
    first_frame_at: float | None = None
    last_frame_at: float | None = None
    cancelled_at: float | None = None
    finished_at: float | None = None  # done, cancelled, terminal error or failure


@dataclass(frozen=True, slots=True)
class ContextResult:
    """Everything one context produced, from ``ContextStream.collect``."""

    context: str
    started: Started
    frames: tuple[AudioFrames, ...]
    pcm: FloatArray | None  # decoded audio (``collect(decode=True)``)
    done: Done | None
    cancelled: Cancelled | None
    error: ErrorMessage | None  # the error that ended the context, if one did
    errors: tuple[ErrorMessage, ...]  # every error for the context, ending or not
    failure: RtClientError | None  # a protocol violation or a lost connection
    times: ContextTimes

    @property
    def frame_count(self) -> int:
        return sum(len(m.frames) for m in self.frames)

    @property
    def audio_ms(self) -> float:
        return self.frame_count * self.started.frame_ms

    @property
    def ok(self) -> bool:
        return self.done is not None and self.error is None and self.failure is None


_END = object()  # queue sentinel after the terminal event


class ContextStream:
    """One open context: send text into it, read its events."""

    def __init__(self, client: RtClient, context: str) -> None:
        self._client = client
        self.context = context
        self.times = ContextTimes()
        self.done: Done | None = None
        self.cancelled: Cancelled | None = None
        self.error: ErrorMessage | None = None
        self.errors: list[ErrorMessage] = []
        self.failure: RtClientError | None = None
        self._started: Started | None = None
        self._chars = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._started_future: asyncio.Future[Started] = loop.create_future()
        self._cancel_future: asyncio.Future[Cancelled] = loop.create_future()
        self._finished_future: asyncio.Future[None] = loop.create_future()
        self._tracker = SeqTracker(context)

    # --- what the server told us ---------------------------------------------------

    @property
    def started(self) -> Started:
        if self._started is None:
            raise RuntimeError(f"context '{self.context}' has not started")
        return self._started

    @property
    def stream(self) -> int:
        return self.started.stream

    @property
    def format(self) -> str:
        return self.started.format

    @property
    def sample_rate(self) -> int:
        return self.started.sample_rate

    @property
    def frame_ms(self) -> int:
        return self.started.frame_ms

    @property
    def pre_skip(self) -> int:
        return self.started.pre_skip

    @property
    def finished(self) -> bool:
        """Nothing more will come for this context."""
        return self._finished_future.done()

    @property
    def chars_sent(self) -> int:
        return self._chars

    # --- sending ---------------------------------------------------------------------

    async def send_text(self, text: str) -> None:
        """Append ``text`` (any fragment, e.g. one LLM token)."""
        start = self._chars
        self._chars += len(text)
        self.times.text_sent.append((self._client.clock(), start, self._chars))
        await self._client._send(Text(context=self.context, text=text))

    async def flush(self) -> None:
        """Speak what is buffered now, without waiting for punctuation."""
        self.times.flush_sent_at.append((self._client.clock(), self._chars))
        await self._client._send(Flush(context=self.context))

    async def end(self) -> None:
        """No more text: the server finishes speaking, then sends `done`."""
        self.times.end_sent_at = self._client.clock()
        await self._client._send(End(context=self.context))

    async def played(self, audio_ms: float) -> None:
        """Tell the server how much audio the listener has heard."""
        await self._client._send(Played(context=self.context, audio_ms=float(audio_ms)))

    async def cancel(self, reply_timeout_s: float | None = 10.0) -> Cancelled:
        """Barge-in: stop now; returns the server's `cancelled` (its ``last_seq`` fence).

        The server answers `cancelled` even for a context that has just
        finished (a normal race), so this always waits for that reply.
        """
        if self.cancelled is not None:
            return self.cancelled
        if self.times.cancel_sent_at is None:
            self.times.cancel_sent_at = self._client.clock()
            await self._client._send(Cancel(context=self.context))
        return await asyncio.wait_for(asyncio.shield(self._cancel_future), reply_timeout_s)

    # --- reading ---------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """The context's events in arrival order, ending after `done`, `cancelled`
        or an error that ends the context.

        Errors that do not end it (``text_too_long`` for one fragment, say) are
        yielded and the iteration goes on. A protocol violation (seq gap) or a
        lost connection raises its ``RtClientError`` after the events before it
        (once; it stays in ``failure``).
        One consumer at a time; breaking out and calling ``events()`` (or
        ``collect()``) again goes on with the next event.
        """
        while True:
            item = await self._queue.get()
            if item is _END:
                self._queue.put_nowait(_END)  # later calls end at once too
                return
            if isinstance(item, RtClientError):
                raise item  # once; later calls end quietly (``failure`` keeps it)
            yield item

    async def wait(self) -> None:
        """Wait until nothing more will come for this context (events stay queued)."""
        await asyncio.shield(self._finished_future)

    async def collect(self, *, decode: bool = True) -> ContextResult:
        """Read the context to its end; with ``decode`` the audio as float32 PCM."""
        frames: list[AudioFrames] = []
        failure: RtClientError | None = None
        try:
            async for event in self.events():
                if isinstance(event, AudioFrames):
                    frames.append(event)
        except RtClientError as exc:
            failure = exc
        started = self.started
        pcm = None
        if decode:
            pcm = decode_frames([f for m in frames for f in m.frames], format=started.format,
                                sample_rate=started.sample_rate, frame_ms=started.frame_ms,
                                pre_skip=started.pre_skip)
        return ContextResult(
            context=self.context, started=started, frames=tuple(frames), pcm=pcm,
            done=self.done, cancelled=self.cancelled, error=self.error,
            errors=tuple(self.errors), failure=failure or self.failure, times=self.times)

    # --- called by the reader -------------------------------------------------------

    def _on_started(self, message: Started, now: float) -> None:
        self._started = message
        self.times.started_at = now
        self._queue.put_nowait(message)
        if not self._started_future.done():
            self._started_future.set_result(message)

    def _on_event(self, message: Event, now: float) -> None:
        if self.finished:
            return
        if isinstance(message, SegmentStarted):
            self.times.segments.append((now, message))
        elif isinstance(message, BufferHint):
            self.times.buffer_hints.append((now, message))
        self._queue.put_nowait(message)

    def _on_audio(self, message: AudioFrames) -> None:
        if self.finished:
            raise ProtocolViolation(
                f"context '{self.context}': frame seq {message.seq} after it finished")
        try:
            self._tracker.accept(message.seq, len(message.frames), message.last)
        except ProtocolViolation as exc:
            self._fail(exc, message.received_at)
            return
        if self.times.first_frame_at is None:
            self.times.first_frame_at = message.received_at
        self.times.last_frame_at = message.received_at
        self._queue.put_nowait(message)

    def _on_done(self, message: Done, now: float) -> None:
        if self.finished:
            return
        self.done = message
        self._queue.put_nowait(message)
        self._finish(now)

    def _on_cancelled(self, message: Cancelled, now: float) -> None:
        self.cancelled = message
        self.times.cancelled_at = now
        if not self._cancel_future.done():
            self._cancel_future.set_result(message)
        if not self.finished:
            self._queue.put_nowait(message)
            self._finish(now)

    def _on_error(self, message: ErrorMessage, now: float) -> None:
        self.errors.append(message)
        if not self._started_future.done():  # the start itself failed
            self._started_future.set_exception(ServerError(message))
            self._finish(now)
            return
        if self.finished:
            return
        self._queue.put_nowait(message)
        if message.code in TERMINAL_ERROR_CODES:
            self.error = message
            self._finish(now)

    def _fail(self, exc: RtClientError, now: float) -> None:
        """A violation or a lost connection: nothing more can be trusted."""
        for future in (self._started_future, self._cancel_future):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved here: nobody may be waiting on it
        if self.finished:
            return
        self.failure = exc
        self._queue.put_nowait(exc)
        self._finish(now)

    def _finish(self, now: float) -> None:
        self.times.finished_at = now
        self._queue.put_nowait(_END)
        if not self._finished_future.done():
            self._finished_future.set_result(None)
        self._client._context_finished(self)


# --- the connection ---------------------------------------------------------------------

class RtClient:
    """One WebSocket connection to rtserver; open it with ``RtClient.connect``."""

    def __init__(self, ws: ClientConnection, ready: Ready, *, clock: Clock = time.monotonic,
                 on_error: Callable[[ErrorMessage | ProtocolViolation], None] | None = None
                 ) -> None:
        self.ws = ws
        self.ready = ready
        self.clock = clock
        self.on_error = on_error
        self.errors: asyncio.Queue[ErrorMessage | ProtocolViolation] = asyncio.Queue()
        self.close_code: int | None = None
        self.close_reason = ""
        self._contexts: dict[str, ContextStream] = {}
        self._streams: dict[int, ContextStream] = {}
        self._recent: OrderedDict[str, ContextStream] = OrderedDict()
        self._names = itertools.count(1)
        self._send_lock = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="rtclient-reader")

    @classmethod
    def connect(cls, url: str, token: str | None = None, *, clock: Clock = time.monotonic,
                on_error: Callable[[ErrorMessage | ProtocolViolation], None] | None = None,
                open_timeout: float = 10.0, max_size: int = DEFAULT_MAX_SIZE,
                headers: dict[str, str] | None = None,
                connect_retries: int = 2) -> _Connecting:
        """Open a connection and read `ready`: ``await`` it or use ``async with``.

        ``token`` goes in ``Authorization: Bearer``. A refused handshake
        raises ``HandshakeRejected`` (status 401 for a wrong key). A TCP
        connection that the server resets or closes before any HTTP answer
        (nothing of it was served: a process of several on one port that
        stops listening drops the connections still queued for it) is tried
        again, up to ``connect_retries`` times.
        """
        if connect_retries < 0:
            raise ValueError("connect_retries must be >= 0")
        return _Connecting(cls, url, token, clock, on_error, open_timeout, max_size,
                           dict(headers or {}), connect_retries)

    # --- contexts ----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._reader.done()

    @property
    def open_contexts(self) -> list[str]:
        return list(self._contexts)

    async def start(self, context: str | None = None, *, voice: str | None = None,
                    format: str = "opus", sample_rate: int = 48000, frame_ms: int = 20,
                    reply_timeout_s: float | None = 10.0) -> ContextStream:
        """Open a context (a name is made up when ``context`` is None) and wait for
        `started`; a refusal raises ``ServerError`` (``duplicate_context``,
        ``too_many_contexts``, ``unsupported_format``, ``unknown_voice``, ...)."""
        if self.closed:
            raise ConnectionLost(self.close_code, self.close_reason)
        name = context if context is not None else f"c{next(self._names)}"
        if name in self._contexts:
            raise RtClientError(f"context '{name}' is already open on this connection")
        ctx = ContextStream(self, name)
        self._contexts[name] = ctx
        self._recent.pop(name, None)
        message = Start(context=name, voice=voice, format=format, sample_rate=sample_rate,
                        frame_ms=frame_ms)
        ctx.times.start_sent_at = self.clock()
        try:
            await self._send(message)
            await asyncio.wait_for(asyncio.shield(ctx._started_future), reply_timeout_s)
        except BaseException:
            if self._contexts.get(name) is ctx:
                del self._contexts[name]
            raise
        return ctx

    async def say(self, text: str, *, decode: bool = True, **start: Any) -> ContextResult:
        """Speak ``text`` in one new context and collect the result."""
        ctx = await self.start(**start)
        await ctx.send_text(text)
        await ctx.end()
        return await ctx.collect(decode=decode)

    async def close(self) -> None:
        """Close the connection normally (1000) and wait for the reader to end.
        Cancelling the caller cancels the reader too and propagates: the
        caller's cancellation is never swallowed."""
        try:
            await self.ws.close()
            await asyncio.wait([self._reader])  # raises only our own cancellation
        except BaseException:
            self._reader.cancel()
            raise
        if not self._reader.cancelled() and (exc := self._reader.exception()) is not None:
            raise exc

    # --- internals ----------------------------------------------------------------------

    async def _send(self, message: ClientMessage) -> None:
        data = encode_client_message(message)
        try:
            async with self._send_lock:
                await self.ws.send(data)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            reason = exc.rcvd.reason if exc.rcvd is not None else ""
            raise ConnectionLost(code, reason) from None

    def _context_finished(self, ctx: ContextStream) -> None:
        if self._contexts.get(ctx.context) is ctx:
            del self._contexts[ctx.context]
        if ctx._started is not None and self._streams.get(ctx._started.stream) is ctx:
            del self._streams[ctx._started.stream]
        self._recent[ctx.context] = ctx
        while len(self._recent) > RECENT_CONTEXTS:
            self._recent.popitem(last=False)

    def _connection_error(self, error: ErrorMessage | ProtocolViolation) -> None:
        self.errors.put_nowait(error)
        if self.on_error is not None:
            self.on_error(error)

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                now = self.clock()
                try:
                    if isinstance(data, bytes):
                        self._on_binary(data, now)
                    else:
                        self._on_text(data, now)
                except ProtocolViolation as exc:
                    self._connection_error(exc)
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            lost = ConnectionLost(self.close_code, self.close_reason)
            now = self.clock()
            for ctx in list(self._contexts.values()):
                ctx._fail(lost, now)

    def _on_binary(self, data: bytes, now: float) -> None:
        try:
            msg = decode_audio_message(data)
        except ValueError as exc:  # the codec names what is wrong with the frame
            raise ProtocolViolation(f"bad binary frame: {exc}") from None
        ctx = self._streams.get(msg.stream)
        if ctx is None:
            raise ProtocolViolation(f"binary frame for stream {msg.stream}, which is not open")
        ctx._on_audio(AudioFrames(stream=msg.stream, seq=msg.seq, frames=msg.frames,
                                  last=msg.last, segment_start=msg.segment_start,
                                  context=ctx.context, received_at=now))

    def _on_text(self, data: str, now: float) -> None:
        try:
            message = parse_server_message(data)
        except UnknownMessageType:
            return  # PROTOCOL.md: the server may add message types
        if isinstance(message, Ready):
            return
        name = message.context
        ctx = self._contexts.get(name) if name is not None else None
        if isinstance(message, Started):
            if ctx is None or ctx._started is not None:
                raise ProtocolViolation(f"'started' for context '{name}', which was not started")
            self._streams[message.stream] = ctx
            ctx._on_started(message, now)
            return
        if isinstance(message, Cancelled):
            target = ctx or (self._recent.get(name) if name is not None else None)
            if target is not None:
                target._on_cancelled(message, now)
            return
        if ctx is None:
            if isinstance(message, ErrorMessage):
                self._connection_error(message)
            return  # a late message for a context that finished: nothing to do
        if isinstance(message, ErrorMessage):
            ctx._on_error(message, now)
        elif isinstance(message, Done):
            ctx._on_done(message, now)
        elif ctx._started is None:
            raise ProtocolViolation(f"'{message.type}' for context '{name}' before 'started'")
        else:
            ctx._on_event(message, now)


class _Connecting:
    """``await RtClient.connect(...)`` or ``async with RtClient.connect(...) as c``."""

    def __init__(self, cls: type[RtClient], url: str, token: str | None, clock: Clock,
                 on_error: Callable[[ErrorMessage | ProtocolViolation], None] | None,
                 open_timeout: float, max_size: int, headers: dict[str, str],
                 retries: int = 0) -> None:
        self._args = (cls, url, token, clock, on_error, open_timeout, max_size, headers)
        self._retries = retries
        self._client: RtClient | None = None

    async def _open(self) -> RtClient:
        cls, url, token, clock, on_error, open_timeout, max_size, headers = self._args
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        tries = self._retries + 1
        for attempt in range(tries):
            try:
                ws = await ws_connect(url, additional_headers=headers or None,
                                      compression=None, max_size=max_size,
                                      open_timeout=open_timeout, proxy=None, max_queue=None)
                break
            except InvalidStatus as exc:
                raise HandshakeRejected(exc.response.status_code) from None
            except (InvalidMessage, ConnectionResetError) as exc:
                unanswered = isinstance(exc, ConnectionResetError) or isinstance(
                    exc.__cause__, EOFError | ConnectionResetError)
                if not unanswered or attempt == tries - 1:
                    raise
        try:
            first = await asyncio.wait_for(ws.recv(), open_timeout)
            if not isinstance(first, str):
                raise ProtocolViolation("the first message is binary, not 'ready'")
            try:
                ready = parse_server_message(first)
            except UnknownMessageType:
                ready = None
            if not isinstance(ready, Ready):
                raise ProtocolViolation("the first message is not 'ready'")
        except ConnectionClosed as exc:
            await ws.close()
            code = exc.rcvd.code if exc.rcvd is not None else None
            raise ConnectionLost(code, exc.rcvd.reason if exc.rcvd is not None else "") from None
        except BaseException:
            await ws.close()
            raise
        return cls(ws, ready, clock=clock, on_error=on_error)

    def __await__(self) -> Generator[Any, None, RtClient]:
        return self._open().__await__()

    async def __aenter__(self) -> RtClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._client is not None:
            await self._client.close()


def say_sync(url: str, text: str, *, token: str | None = None, decode: bool = True,
             **start: Any) -> ContextResult:
    """Blocking helper for scripts: connect, speak ``text``, return the result."""
    async def run() -> ContextResult:
        async with RtClient.connect(url, token) as client:
            return await client.say(text, decode=decode, **start)
    return asyncio.run(run())


# --- SDK helpers ------------------------------------------------------------------

async def send_tokens(ctx: ContextStream, tokens: AsyncIterable[str] | Iterable[str], *,
                      end: bool = True) -> int:
    """Pipe a token stream (an LLM's reply as it is generated) into ``ctx``,
    each fragment as it arrives, then ``end`` it (unless ``end=False``).
    Returns the characters sent. Empty fragments are skipped."""
    sent = 0
    if isinstance(tokens, AsyncIterable):
        async for token in tokens:
            if token:
                await ctx.send_text(token)
                sent += len(token)
    else:
        for token in tokens:
            if token:
                await ctx.send_text(token)
                sent += len(token)
    if end:
        await ctx.end()
    return sent


async def openai_text(chunks: AsyncIterable[Any]) -> AsyncIterator[str]:
    """The text of an OpenAI-style chat completion stream
    (``client.chat.completions.create(..., stream=True)``): each chunk's
    ``choices[0].delta.content``, skipping chunks without text."""
    async for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else chunk.choices
        if not choices:
            continue
        delta = choices[0]["delta"] if isinstance(choices[0], dict) else choices[0].delta
        text = delta.get("content") if isinstance(delta, dict) else delta.content
        if text:
            yield text


async def report_played(ctx: ContextStream, heard_ms: Callable[[], float], *,
                        every_s: float = 0.25) -> None:
    """Tell the server how much of ``ctx`` the listener has heard: sends
    `played` with ``heard_ms()`` every ``every_s`` while it grows, until the
    context finishes. Run it as a task beside the player; cancel it or let
    it end with the context."""
    last = -1.0
    while not ctx.finished:
        now = float(heard_ms())
        if now > last:
            await ctx.played(now)
            last = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.wait(), every_s)


def word_times(text: str, start_s: float, end_s: float) -> list[tuple[str, float]]:
    """The words of a segment's ``text`` with start times spread over
    [start_s, end_s) by the character offset each word begins at. The server
    reports when each segment starts (``segment.seq * frame_ms``); the next
    segment's start (or ``done.audio_ms``) is where it ends."""
    words: list[tuple[str, float]] = []
    n = max(1, len(text))
    pos = 0
    for word in text.split():
        at = text.index(word, pos)
        pos = at + len(word)
        words.append((word, start_s + (end_s - start_s) * at / n))
    return words


__all__ = [
    "AudioFrames",
    "ConnectionLost",
    "ContextResult",
    "ContextStream",
    "ContextTimes",
    "Event",
    "HandshakeRejected",
    "ProtocolViolation",
    "RtClient",
    "RtClientError",
    "SeqGapError",
    "SeqTracker",
    "ServerError",
    "decode_frames",
    "openai_text",
    "parse_server_message",
    "report_played",
    "say_sync",
    "send_tokens",
    "word_times",
]
