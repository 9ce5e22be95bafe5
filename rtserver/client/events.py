"""What a context yields (``Event``) and what it produced (``ContextResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rtserver.client.decode import FloatArray
from rtserver.errors import RtClientError
from rtserver.protocol.messages import (
    BufferHint,
    Cancelled,
    Done,
    ErrorMessage,
    SegmentStarted,
    Started,
    Words,
    WordSpan,
)
from rtserver.protocol.wire import AudioMessage


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


Event = (Started | SegmentStarted | BufferHint | Words | AudioFrames | Done | Cancelled
         | ErrorMessage)



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
    words: tuple[Words, ...] = ()  # every ``words`` event, in order

    @property
    def word_spans(self) -> list[WordSpan]:
        """Every word the context spoke, in order, with when it is heard."""
        return [w for event in self.words for w in event.words]

    @property
    def frame_count(self) -> int:
        return sum(len(m.frames) for m in self.frames)

    @property
    def audio_ms(self) -> float:
        return self.frame_count * self.started.frame_ms

    @property
    def ok(self) -> bool:
        return self.done is not None and self.error is None and self.failure is None


__all__ = [
    "AudioFrames",
    "ContextResult",
    "ContextTimes",
    "Event",
]
