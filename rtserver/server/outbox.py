"""The bounded, per-connection send queue and its ordering rules.

Producers (context pipelines) put control messages and audio frames; one
writer task drains it into the WebSocket. Capacity is counted in audio
milliseconds: a producer that finds the queue full waits (backpressure), so a
slow reader slows only its own connection's contexts.

Cancel fencing happens here: ``purge(context)`` drops that context's unsent
frames, and the writer's record of the last seq it handed to the socket is the
``last_seq`` of ``cancelled``. Nothing of a context is ever queued after its
fence, because its producer is stopped before the purge.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rtserver.protocol.messages import ServerMessage


@dataclass(slots=True)
class ContextLedger:
    """What the writer has sent for one context (read by the pipeline)."""

    context: str
    stream: int
    frame_ms: int
    voice: str = ""
    next_seq: int = 0  # next seq to assign (producer side)
    last_sent_seq: int = -1  # highest seq handed to the socket
    first_sent_at: float | None = None  # loop time the first frame was sent
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class AudioItem:
    ledger: ContextLedger
    seq: int
    frames: tuple[bytes, ...]
    segment_start: bool
    last: bool

    @property
    def audio_ms(self) -> int:
        return len(self.frames) * self.ledger.frame_ms


@dataclass(frozen=True, slots=True)
class ControlItem:
    message: ServerMessage
    context: str | None = None


@dataclass(frozen=True, slots=True)
class DeferredItem:
    """A message built at send time (``done`` needs the first frame's send time)."""

    build: Callable[[], ServerMessage]
    context: str


Item = AudioItem | ControlItem | DeferredItem


@dataclass(slots=True)
class Outbox:
    capacity_ms: int
    _items: deque[Item] = field(default_factory=deque)
    _queued_ms: int = 0
    _nonempty: asyncio.Event = field(default_factory=asyncio.Event)
    _space: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def __post_init__(self) -> None:
        self._space.set()

    @property
    def queued_ms(self) -> int:
        return self._queued_ms

    def __len__(self) -> int:
        return len(self._items)

    def put_control(self, message: ServerMessage, context: str | None = None, *,
                    urgent: bool = False) -> None:
        """Control messages are small and never wait; ``urgent`` jumps the queue."""
        item = ControlItem(message, context)
        if urgent:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        self._nonempty.set()

    def put_deferred(self, build: Callable[[], ServerMessage], context: str) -> None:
        self._items.append(DeferredItem(build, context))
        self._nonempty.set()

    async def put_audio(self, ledger: ContextLedger, frames: list[bytes], *,
                        segment_start: bool, last: bool) -> int:
        """Queue frames (waiting while the queue is full); return the first seq."""
        while self._queued_ms >= self.capacity_ms and not self.closed:
            self._space.clear()
            await self._space.wait()
        if self.closed:
            raise ConnectionError("connection closed")
        seq = ledger.next_seq
        ledger.next_seq += len(frames)
        item = AudioItem(ledger, seq, tuple(frames), segment_start, last)
        self._items.append(item)
        self._queued_ms += item.audio_ms
        self._nonempty.set()
        return seq

    def purge(self, context: str) -> int:
        """Drop the context's queued items; return how many frames were dropped."""
        kept: deque[Item] = deque()
        dropped = 0
        for item in self._items:
            if isinstance(item, AudioItem) and item.ledger.context == context:
                dropped += len(item.frames)
                self._queued_ms -= item.audio_ms
            elif isinstance(item, (ControlItem, DeferredItem)) and item.context == context:
                continue
            else:
                kept.append(item)
        self._items = kept
        if self._queued_ms < self.capacity_ms:
            self._space.set()
        return dropped

    async def get_batch(self, max_frames: int) -> Item:
        """Next item to send; consecutive audio of one context is merged.

        Merging stops at a segment start (its flag marks a message's first
        frame) and after a context's last frame.
        """
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        item = self._items.popleft()
        if isinstance(item, AudioItem):
            self._queued_ms -= item.audio_ms
            frames = list(item.frames)
            last = item.last
            while (not last and self._items and len(frames) < max_frames):
                nxt = self._items[0]
                if not (isinstance(nxt, AudioItem) and nxt.ledger is item.ledger
                        and not nxt.segment_start and nxt.seq == item.seq + len(frames)
                        and len(frames) + len(nxt.frames) <= max_frames):
                    break
                self._items.popleft()
                self._queued_ms -= nxt.audio_ms
                frames.extend(nxt.frames)
                last = nxt.last
            if self._queued_ms < self.capacity_ms:
                self._space.set()
            item = AudioItem(item.ledger, item.seq, tuple(frames), item.segment_start, last)
        return item

    def close(self) -> None:
        """Wake every waiting producer; later puts raise ConnectionError."""
        self.closed = True
        self._space.set()
        self._nonempty.set()
