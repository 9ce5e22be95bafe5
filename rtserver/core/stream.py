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
from typing import TYPE_CHECKING

from rtserver.core.events import AudioFrames, ControlEvent, Event, Finished, SinkClosed
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, Start

if TYPE_CHECKING:
    from rtserver.core.context import SpeechContext
    from rtserver.core.speech import SpeechCore

StreamEvent = ControlEvent | AudioFrames | Done


class EventQueue:
    """A bounded ``Sink`` read by one consumer (``get``)."""

    def __init__(self, capacity_ms: int = 5_000) -> None:
        self.capacity_ms = capacity_ms
        self._items: deque[Event] = deque()
        self._queued_ms = 0
        self._nonempty = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self.closed = False

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None:
        if urgent:
            self._items.appendleft(event)
        else:
            self._items.append(event)
        self._nonempty.set()

    async def audio(self, event: AudioFrames) -> None:
        while self._queued_ms >= self.capacity_ms and not self.closed:
            self._space.clear()
            await self._space.wait()
        if self.closed:
            raise SinkClosed("the event queue is closed")
        self._items.append(event)
        self._queued_ms += event.audio_ms
        self._nonempty.set()

    def finish(self, event: Finished) -> None:
        self._items.append(event)
        self._nonempty.set()

    def fence(self, context: str) -> None:
        kept: deque[Event] = deque()
        for item in self._items:
            if isinstance(item, AudioFrames) and item.context == context:
                self._queued_ms -= item.audio_ms
            elif item.context != context:
                kept.append(item)
        self._items = kept
        self._space.set()

    def close(self) -> None:
        """Wake a waiting producer; later puts raise ``SinkClosed``."""
        self.closed = True
        self._space.set()
        self._nonempty.set()

    async def get(self) -> StreamEvent:
        """The next event, in order; audio is delivered as it is taken and
        ``Finished`` becomes its ``Done``."""
        while not self._items:
            if self.closed:
                raise SinkClosed("the event queue is closed")
            self._nonempty.clear()
            await self._nonempty.wait()
        item = self._items.popleft()
        if isinstance(item, AudioFrames):
            self._queued_ms -= item.audio_ms
            if self._queued_ms < self.capacity_ms:
                self._space.set()
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
