"""The bounded, per-connection send queue: the WebSocket's ``Sink``.

The connection's contexts put their events (``rtserver.core.events``) and its
own control messages; one writer task drains it into the socket. Capacity is
counted in audio milliseconds: a producer that finds the queue full waits
(backpressure), so a slow reader slows only its own connection's contexts.

``fence(context)`` drops that context's unsent events; the writer records on
the context's ``Ledger`` the last seq it handed to the socket, which is the
``last_seq`` of ``cancelled``. Nothing of a context is queued after its fence,
because the core stops its producer before fencing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from rtserver.core.events import AudioFrames, ControlEvent, Finished, SinkClosed
from rtserver.protocol.messages import ServerMessage


@dataclass(frozen=True, slots=True)
class ControlItem:
    message: ServerMessage
    context: str | None = None


Item = AudioFrames | ControlItem | Finished


@dataclass(slots=True)
class Outbox:
    capacity_ms: int
    _items: deque[Item] = field(default_factory=deque)
    _queued_ms: int = 0
    _controls: int = 0  # control messages queued (the connection caps its replies)
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

    @property
    def control_count(self) -> int:
        """Control messages (JSON) queued and not yet taken by the writer."""
        return self._controls

    # --- the Sink ----------------------------------------------------------------

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None:
        self.put_control(event, event.context, urgent=urgent)

    async def audio(self, event: AudioFrames) -> None:
        """Queue frames, waiting while the queue is full."""
        while self._queued_ms >= self.capacity_ms and not self.closed:
            self._space.clear()
            await self._space.wait()
        if self.closed:
            raise SinkClosed("connection closed")
        self._items.append(event)
        self._queued_ms += event.audio_ms
        self._nonempty.set()

    def finish(self, event: Finished) -> None:
        self._items.append(event)
        self._nonempty.set()

    def fence(self, context: str) -> None:
        self.purge(context)

    # --- the connection's side -----------------------------------------------------

    def put_control(self, message: ServerMessage, context: str | None = None, *,
                    urgent: bool = False) -> None:
        """Control messages are small and never wait; ``urgent`` jumps the queue."""
        item = ControlItem(message, context)
        self._controls += 1
        if urgent:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        self._nonempty.set()

    def purge(self, context: str) -> int:
        """Drop the context's queued items; return how many frames were dropped."""
        kept: deque[Item] = deque()
        dropped = 0
        for item in self._items:
            if isinstance(item, AudioFrames) and item.ledger.context == context:
                dropped += len(item.frames)
                self._queued_ms -= item.audio_ms
            elif isinstance(item, (ControlItem, Finished)) and item.context == context:
                if isinstance(item, ControlItem):
                    self._controls -= 1
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
        if isinstance(item, ControlItem):
            self._controls -= 1
        elif isinstance(item, AudioFrames):
            self._queued_ms -= item.audio_ms
            if (not item.last and self._items and len(item.frames) < max_frames
                    and isinstance(self._items[0], AudioFrames)):
                frames = list(item.frames)
                last: bool = item.last
                while not last and self._items and len(frames) < max_frames:
                    nxt = self._items[0]
                    if not (isinstance(nxt, AudioFrames) and nxt.ledger is item.ledger
                            and not nxt.segment_start and nxt.seq == item.seq + len(frames)
                            and len(frames) + len(nxt.frames) <= max_frames):
                        break
                    self._items.popleft()
                    self._queued_ms -= nxt.audio_ms
                    frames.extend(nxt.frames)
                    last = nxt.last
                if len(frames) > len(item.frames):
                    item = AudioFrames(item.ledger, item.seq, tuple(frames),
                                       item.segment_start, last)
            if self._queued_ms < self.capacity_ms:
                self._space.set()
        return item

    def close(self) -> None:
        """Wake every waiting producer; later puts raise ``SinkClosed``."""
        self.closed = True
        self._space.set()
        self._nonempty.set()
