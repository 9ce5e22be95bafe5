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

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rtserver.core.events import AudioFrames, ControlEvent, Finished
from rtserver.core.stream import AudioBoundedQueue
from rtserver.protocol.messages import ServerMessage


@dataclass(frozen=True, slots=True)
class ControlItem:
    message: ServerMessage
    context: str | None = None


Item = AudioFrames | ControlItem | Finished


class Outbox(AudioBoundedQueue[ControlItem]):
    """The connection's send queue (``AudioBoundedQueue``) and its ``Sink``."""

    closed_message = "connection closed"

    def __init__(self, capacity_ms: int) -> None:
        super().__init__(capacity_ms)
        self._controls = 0  # control messages queued (the connection caps its replies)
        # applied to each control message as it is queued (the connection's
        # request ids: the context's id then, not its name's next owner's)
        self.stamp: Callable[[ServerMessage, str | None], ServerMessage] | None = None

    @property
    def control_count(self) -> int:
        """Control messages (JSON) queued and not yet taken by the writer."""
        return self._controls

    # --- the Sink ----------------------------------------------------------------

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None:
        self.put_control(event, event.context, urgent=urgent)

    def fence(self, context: str) -> None:
        self.purge(context)

    # --- the connection's side -----------------------------------------------------

    def put_control(self, message: ServerMessage, context: str | None = None, *,
                    urgent: bool = False) -> None:
        """Control messages are small and never wait; ``urgent`` jumps the queue."""
        if self.stamp is not None:
            message = self.stamp(message, context)
        self._controls += 1
        self._put(ControlItem(message, context), urgent=urgent)

    def purge(self, context: str) -> int:
        """Drop the context's queued items; return how many frames were dropped."""
        kept: deque[Item] = deque()
        dropped = dropped_ms = 0
        for item in self._items:
            if isinstance(item, AudioFrames) and item.ledger.context == context:
                dropped += len(item.frames)
                dropped_ms += item.audio_ms
            elif isinstance(item, (ControlItem, Finished)) and item.context == context:
                if isinstance(item, ControlItem):
                    self._controls -= 1
                continue
            else:
                kept.append(item)
        self._items = kept
        self._took(dropped_ms)
        return dropped

    async def get_batch(self, max_frames: int) -> Item:
        """Next item to send; consecutive audio of one context is merged.

        Merging stops at a segment start (its flag marks a message's first
        frame) and after a context's last frame.
        """
        item = await self._next()
        if isinstance(item, ControlItem):
            self._controls -= 1
        elif isinstance(item, AudioFrames):
            taken_ms = item.audio_ms
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
                    taken_ms += nxt.audio_ms
                    frames.extend(nxt.frames)
                    last = nxt.last
                if len(frames) > len(item.frames):
                    item = AudioFrames(item.ledger, item.seq, tuple(frames),
                                       item.segment_start, last)
            self._took(taken_ms)
        return item
