"""One open context: send text into it, read its events (``ContextStream``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from rtserver.client.decode import decode_frames
from rtserver.client.errors import ServerError
from rtserver.client.events import AudioFrames, ContextResult, ContextTimes, Event
from rtserver.errors import ProtocolViolation, RtClientError
from rtserver.protocol.messages import (
    BufferHint,
    Cancel,
    Cancelled,
    Done,
    End,
    ErrorMessage,
    Flush,
    Played,
    SegmentStarted,
    Started,
    Text,
    Words,
)
from rtserver.protocol.wire import SeqTracker

if TYPE_CHECKING:
    from rtserver.client.connection import RtClient

# Context errors after which the server sends nothing more for the context
# (the session ends it: engine failure, internal error, overload and close).
TERMINAL_ERROR_CODES = frozenset({"engine_failed", "internal", "overloaded"})
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
        self.words: list[Words] = []  # ``words`` events: when each word is heard
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
        async with asyncio.timeout(reply_timeout_s):  # not wait_for: cpython#86296
            return await asyncio.shield(self._cancel_future)

    # --- reading ---------------------------------------------------------------------

    async def events(self) -> AsyncGenerator[Event, None]:
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
            errors=tuple(self.errors), failure=failure or self.failure, times=self.times,
            words=tuple(self.words))

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
        elif isinstance(message, Words):
            self.words.append(message)
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


__all__ = [
    "TERMINAL_ERROR_CODES",
    "ContextStream",
]
