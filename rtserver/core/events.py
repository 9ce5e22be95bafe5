"""What a speech context emits, and the narrow ``Sink`` that takes it.

Events are typed and frozen. Control events are the protocol's own messages
(``segment``, ``buffer``, ``words``, ``cancelled``, ``error``: small, never
waiting); audio comes as ``AudioFrames`` (encoded frames with their seqs;
putting it may wait: backpressure); ``Finished`` closes a context that spoke to its end and
builds its ``done`` when the sink has delivered the audio before it.

The sink tells the core what it delivered through the context's ``Ledger``
(``delivered``); the cancel fence and TTFA read it. Pure: no asyncio here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rtserver.clock import Clock
from rtserver.protocol.messages import (
    BufferHint,
    Cancelled,
    Done,
    ErrorMessage,
    SegmentStarted,
    Words,
)

ControlEvent = SegmentStarted | BufferHint | Words | Cancelled | ErrorMessage


@dataclass(slots=True)
class Ledger:
    """One context's frames: numbered by the core, delivered by the sink."""

    context: str
    stream: int
    frame_ms: int
    clock: Clock
    voice: str = ""
    next_seq: int = 0  # next seq to assign (the core)
    last_sent_seq: int = -1  # highest seq the sink delivered
    first_sent_at: float | None = None  # when the sink delivered the first frame
    fenced: bool = False  # cancelled: the sink delivers nothing more of it

    def delivered(self, last_seq: int) -> None:
        """The sink handed frames up to ``last_seq`` to its client."""
        self.last_sent_seq = last_seq
        if self.first_sent_at is None:
            self.first_sent_at = self.clock.now()


@dataclass(frozen=True, slots=True)
class AudioFrames:
    """Consecutive frames of one context: seqs ``seq`` .. ``seq + len - 1``.
    ``segment_start``: the first frame opens a segment; ``last``: the last
    frame of the context."""

    ledger: Ledger
    seq: int
    frames: tuple[bytes, ...]
    segment_start: bool
    last: bool

    @property
    def context(self) -> str:
        return self.ledger.context

    @property
    def audio_ms(self) -> int:
        return len(self.frames) * self.ledger.frame_ms


@dataclass(frozen=True, slots=True)
class Finished:
    """The context spoke to its end; ``done()`` builds its ``done`` message
    (call it once, when every frame before it is delivered: it reads the
    ledger's send time for TTFA)."""

    context: str
    done: Callable[[], Done]


Event = ControlEvent | AudioFrames | Finished


class SinkClosed(ConnectionError):
    """The sink is closed (its client left): nothing more can be delivered.
    Only this ends a context quietly; any other error is reported."""


class Sink(Protocol):
    """Where one or more contexts' events go, in the order they are put.

    ``control`` and ``finish`` never wait. ``audio`` may wait while the sink
    is full (the context's producer waits with it) and raises
    ``SinkClosed`` once the sink is closed. ``fence`` drops every event
    of the context not yet delivered (cancel); ``urgent`` control jumps ahead.
    """

    def control(self, event: ControlEvent, *, urgent: bool = False) -> None: ...

    async def audio(self, event: AudioFrames) -> None: ...

    def finish(self, event: Finished) -> None: ...

    def fence(self, context: str) -> None: ...
