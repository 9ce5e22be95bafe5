"""Speak one context and iterate its events: the sink for transports that
answer one request with one stream (the HTTP speech endpoint, ``rtserver
say``, tests).

    async with speak(core, Start(context="r1", format="pcm_s16le",
                                 sample_rate=24000)) as ctx:
        ctx.feed("Hello there.")
        ctx.end()
        async for event in ctx.events():
            ...  # SegmentStarted, BufferHint, AudioFrames, then Done
                 # (or ErrorMessage / Cancelled, which end it too)

Audio counts as delivered when ``events()`` yields it; the queue holds at most
``capacity_ms`` of audio, so a consumer that stops reading makes the context
wait (backpressure), never drops audio. Leaving the block early cancels the
context.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Generic, TypeVar

from rtserver.core.events import AudioFrames, ControlEvent, Finished, SinkClosed
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, Start

if TYPE_CHECKING:
    from rtserver.core.context import SpeechContext
    from rtserver.core.speech import SpeechCore

StreamEvent = ControlEvent | AudioFrames | Done
T = TypeVar("T")


class AudioBoundedQueue(Generic[T]):
    """A queue whose capacity is audio: ``audio`` waits while ``capacity_ms``
    of frames are queued (backpressure, nothing dropped); control and finish
    items never wait. One consumer takes items (``_next``) and reports the
    audio it took (``_took``). The core's ``EventQueue`` and the WebSocket's
    outbox are both one."""

    closed_message = "the queue is closed"

    def __init__(self, capacity_ms: int) -> None:
        self.capacity_ms = capacity_ms
        self._items: deque[T | AudioFrames | Finished] = deque()
        self._queued_ms = 0
        self._nonempty = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self.closed = False

    @property
    def queued_ms(self) -> int:
        return self._queued_ms

    def __len__(self) -> int:
        return len(self._items)

    def _put(self, item: T, *, urgent: bool = False) -> None:
        if urgent:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        self._nonempty.set()

    async def audio(self, event: AudioFrames) -> None:
        """Queue frames, waiting while the queue is full."""
        while self._queued_ms >= self.capacity_ms and not self.closed:
            self._space.clear()
            await self._space.wait()
        if self.closed:
            raise SinkClosed(self.closed_message)
        self._items.append(event)
        self._queued_ms += event.audio_ms
        self._nonempty.set()

    def finish(self, event: Finished) -> None:
        self._items.append(event)
        self._nonempty.set()

    def close(self) -> None:
        """Wake every waiting producer and the consumer; later puts raise ``SinkClosed``."""
        self.closed = True
        self._space.set()
        self._nonempty.set()

    async def _next(self) -> T | AudioFrames | Finished:
        """The oldest item, waiting for one; ``SinkClosed`` once closed and empty."""
        while not self._items:
            if self.closed:
                raise SinkClosed(self.closed_message)
            self._nonempty.clear()
            await self._nonempty.wait()
        return self._items.popleft()

    def _took(self, audio_ms: int) -> None:
        """``audio_ms`` of queued frames left the queue (taken or dropped)."""
        self._queued_ms -= audio_ms
        if self._queued_ms < self.capacity_ms:
            self._space.set()


class EventQueue(AudioBoundedQueue[ControlEvent]):
    """A bounded ``Sink`` read by one consumer (``get``)."""

    closed_message = "the event queue is closed"

    def __init__(self, capacity_ms: int = 5_000) -> None:
        super().__init__(capacity_ms)

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None:
        self._put(event, urgent=urgent)

    def fence(self, context: str) -> None:
        kept: deque[ControlEvent | AudioFrames | Finished] = deque()
        dropped_ms = 0
        for item in self._items:
            if isinstance(item, AudioFrames) and item.context == context:
                dropped_ms += item.audio_ms
            elif item.context != context:
                kept.append(item)
        self._items = kept
        self._took(dropped_ms)
        self._space.set()

    async def get(self) -> StreamEvent:
        """The next event, in order; audio is delivered as it is taken and
        ``Finished`` becomes its ``Done``."""
        item = await self._next()
        if isinstance(item, AudioFrames):
            self._took(item.audio_ms)
            if item.ledger.fenced:
                return await self.get()
            item.ledger.delivered(item.seq + len(item.frames) - 1)
            return item
        if isinstance(item, Finished):
            return item.done()
        return item


class ContextStream:
    """One context of ``speak``: input as ``SpeechContext``, events to iterate."""

    def __init__(self, ctx: SpeechContext, queue: EventQueue) -> None:
        self.context = ctx
        self._queue = queue

    def feed(self, text: str) -> None:
        self.context.feed(text)

    def flush(self) -> None:
        self.context.flush()

    def end(self) -> None:
        self.context.end()

    async def cancel(self) -> None:
        await self.context.cancel()

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Every event until ``Done``, ``ErrorMessage`` or ``Cancelled`` (included)."""
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, (Done, ErrorMessage, Cancelled)):
                return


@contextlib.asynccontextmanager
async def speak(core: SpeechCore, start: Start, *, capacity_ms: int = 5_000
                ) -> AsyncIterator[ContextStream]:
    """Open a context on ``core`` and run it for the duration of the block."""
    queue = EventQueue(capacity_ms)
    ctx = core.open(start, queue)
    async with asyncio.TaskGroup() as group:
        group.create_task(ctx.run(), name=f"ctx:{start.context}")
        try:
            yield ContextStream(ctx, queue)
        finally:
            if ctx.outcome is None:  # left early: fence it, stop its work
                await ctx.cancel()
            queue.close()
