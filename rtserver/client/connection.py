"""The connection: ``RtClient`` reads every frame and routes it to its
context; ``say_sync`` for scripts."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from rtserver.client.context import ContextStream
from rtserver.client.errors import ConnectionLost, HandshakeRejected
from rtserver.client.events import AudioFrames, ContextResult
from rtserver.errors import ProtocolViolation, RtClientError, UnknownMessageType
from rtserver.protocol.messages import (
    Cancelled,
    ClientMessage,
    Done,
    ErrorMessage,
    LexiconEntry,
    Ready,
    Start,
    Started,
    encode_client_message,
    parse_server_message,
)
from rtserver.protocol.wire import decode_audio_message

Clock = Callable[[], float]

# Server messages are small (audio frames are tens of bytes to a few KiB);
# 16 MiB leaves room for a large `ready` or a many-frame binary message.
DEFAULT_MAX_SIZE = 16 * 1024 * 1024
RECENT_CONTEXTS = 256  # finished contexts kept to route late `cancelled` replies


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
                    reply_timeout_s: float | None = 10.0,
                    request_id: str | None = None, lexicon: Sequence[LexiconEntry] = (),
                    speed: float | None = None, text_format: str = "text") -> ContextStream:
        """Open a context (a name is made up when ``context`` is None) and wait for
        `started`; a refusal raises ``ServerError`` (``duplicate_context``,
        ``too_many_contexts``, ``unsupported_format``, ``unknown_voice``, ...).
        ``request_id``: the context's id in the server's replies and logs (your
        LLM call's, say); the server makes one when it is None. ``lexicon``,
        ``speed``, ``text_format``: docs/PROTOCOL-EXTENSIONS.md, "Pronunciation,
        SSML and speed"."""
        if self.closed:
            raise ConnectionLost(self.close_code, self.close_reason)
        name = context if context is not None else f"c{next(self._names)}"
        if name in self._contexts:
            raise RtClientError(f"context '{name}' is already open on this connection")
        ctx = ContextStream(self, name)
        self._contexts[name] = ctx
        self._recent.pop(name, None)
        message = Start(context=name, voice=voice, format=format, sample_rate=sample_rate,
                        frame_ms=frame_ms, request_id=request_id, lexicon=tuple(lexicon),
                        speed=speed, text_format=text_format)
        ctx.times.start_sent_at = self.clock()
        try:
            await self._send(message)
            async with asyncio.timeout(reply_timeout_s):  # not wait_for: cpython#86296
                await asyncio.shield(ctx._started_future)
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
            async with asyncio.timeout(open_timeout):  # not wait_for: cpython#86296
                first = await ws.recv()
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


__all__ = [
    "DEFAULT_MAX_SIZE",
    "Clock",
    "RtClient",
    "say_sync",
]
