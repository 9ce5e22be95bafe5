"""The per-connection session state machine (sans-I/O).

It validates every client message against the protocol and the limits, owns
the table of contexts, and answers with *actions* for the I/O shell to carry
out: reply with a message, open/feed/flush/end/cancel a context (the core speaks it), or
close the connection. It never touches sockets, tasks or clocks.

Context life: ``open`` (after ``start``) -> ``ending`` (after ``end``) ->
finished (``done``, ``cancelled`` or a failure, reported by the shell through
``context_finished``). A finished name may be started again. A ``cancel`` for
a context that finished a moment ago is answered ``cancelled`` again (barge-in
races are normal), not with an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from rtserver.errors import (
    BadMessage,
    CloseCode,
    DuplicateContext,
    RtError,
    TextTooLong,
    TooManyContexts,
    UnknownContext,
    UnknownVoice,
    UnsupportedFormat,
)
from rtserver.protocol.messages import (
    AUDIO_FORMATS,
    FRAME_MS,
    SAMPLE_RATES,
    Cancel,
    Cancelled,
    ClientMessage,
    End,
    ErrorMessage,
    Flush,
    Played,
    ServerMessage,
    Start,
    Text,
    echo,
    parse_client_message,
)

RECENTLY_FINISHED = 64  # finished contexts remembered for late cancels


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_text_chars: int
    max_contexts: int


# --- actions for the shell ----------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reply:
    message: ServerMessage


@dataclass(frozen=True, slots=True)
class OpenContext:
    start: Start
    voice: str
    stream: int


@dataclass(frozen=True, slots=True)
class FeedText:
    context: str
    text: str


@dataclass(frozen=True, slots=True)
class FlushContext:
    context: str


@dataclass(frozen=True, slots=True)
class EndContext:
    context: str


@dataclass(frozen=True, slots=True)
class CancelContext:
    """Stop the context now; the shell replies ``cancelled`` with its fence."""

    context: str


@dataclass(frozen=True, slots=True)
class ListenerProgress:
    context: str
    audio_ms: float


@dataclass(frozen=True, slots=True)
class CloseConnection:
    code: int
    reason: str


Action = (Reply | OpenContext | FeedText | FlushContext | EndContext | CancelContext
          | ListenerProgress | CloseConnection)


class ContextState(Enum):
    OPEN = "open"
    ENDING = "ending"
    CANCELLING = "cancelling"


@dataclass(slots=True)
class _Context:
    stream: int
    state: ContextState = ContextState.OPEN
    chars: int = 0


class Session:
    """Protocol state of one connection. Feed it frames, carry out its actions."""

    def __init__(self, limits: SessionLimits, voices: Collection[str], default_voice: str,
                 voice_aliases: dict[str, str] | None = None,
                 families: Collection[str] = ()) -> None:
        self._limits = limits
        self._voices = voices  # read at each start: a live view sees voices added later
        self._families = tuple(families)  # voice families, for unknown_voice's message
        self._aliases = voice_aliases if voice_aliases is not None else {}  # live, as voices
        self._default_voice = default_voice
        self._contexts: dict[str, _Context] = {}
        self._finished: OrderedDict[str, int] = OrderedDict()  # context -> last_seq
        self._next_stream = 0

    # --- input ---------------------------------------------------------------

    def receive_text(self, data: str) -> list[Action]:
        """One text frame from the client."""
        try:
            message = parse_client_message(data)
            return self._handle(message)
        except RtError as err:
            return [Reply(error_message(err))]

    def receive_binary(self, data: bytes) -> list[Action]:
        """Clients never send binary frames (PROTOCOL.md: server to client only)."""
        return [Reply(ErrorMessage(code=BadMessage.code.value,
                                   message="binary frames are server to client only"))]

    def context_finished(self, context: str, last_seq: int) -> None:
        """The shell reports a context ended (done, cancelled or failed)."""
        if self._contexts.pop(context, None) is not None:
            self._finished[context] = last_seq
            self._finished.move_to_end(context)
            while len(self._finished) > RECENTLY_FINISHED:
                self._finished.popitem(last=False)

    def forget(self, context: str) -> None:
        """The shell refused to open ``context`` after the session accepted its
        ``start`` (admission, rate limits): it was never open, and its name is
        free again (a later ``end`` or ``cancel`` for it is ``unknown_context``)."""
        self._contexts.pop(context, None)

    def refund(self, context: str, chars: int) -> None:
        """The shell refused a ``text`` the session accepted (a rate limit):
        its characters do not count against ``max_text_chars``."""
        entry = self._contexts.get(context)
        if entry is not None:
            entry.chars = max(0, entry.chars - chars)

    # --- queries ---------------------------------------------------------------

    @property
    def open_contexts(self) -> list[str]:
        return list(self._contexts)

    def stream_of(self, context: str) -> int:
        return self._contexts[context].stream

    # --- handling --------------------------------------------------------------

    def _handle(self, message: ClientMessage) -> list[Action]:
        if isinstance(message, Start):
            try:
                return self._start(message)
            except RtError as err:  # a refused start echoes its request id
                err.request_id = err.request_id or message.request_id
                raise
        ctx = message.context
        if isinstance(message, Cancel):
            entry = self._contexts.get(ctx)
            if entry is None:
                if ctx in self._finished:
                    return [Reply(Cancelled(context=ctx, last_seq=self._finished[ctx]))]
                raise UnknownContext(f"no context '{ctx}'", context=ctx)
            if entry.state is ContextState.CANCELLING:
                return []  # the first cancel's reply is on its way
            entry.state = ContextState.CANCELLING
            return [CancelContext(ctx)]
        entry = self._contexts.get(ctx)
        if entry is None:
            if isinstance(message, Played) and ctx in self._finished:
                # the listener reports after `done`: normal; its first report counts
                return [ListenerProgress(ctx, message.audio_ms)]
            raise UnknownContext(f"no context '{ctx}'", context=ctx)
        if isinstance(message, Played):
            return [ListenerProgress(ctx, message.audio_ms)]
        if entry.state is ContextState.CANCELLING:
            return []  # late input for a cancelled context is moot
        if entry.state is ContextState.ENDING:
            raise BadMessage(f"context '{ctx}' has ended; no more input", context=ctx)
        if isinstance(message, Text):
            entry.chars += len(message.text)
            if entry.chars > self._limits.max_text_chars:
                entry.chars -= len(message.text)
                raise TextTooLong(
                    f"context '{ctx}' would exceed {self._limits.max_text_chars} characters",
                    context=ctx)
            return [FeedText(ctx, message.text)] if message.text else []
        if isinstance(message, Flush):
            return [FlushContext(ctx)]
        if isinstance(message, End):
            entry.state = ContextState.ENDING
            return [EndContext(ctx)]
        raise BadMessage(f"unexpected message for context '{ctx}'", context=ctx)

    def _start(self, start: Start) -> list[Action]:
        ctx = start.context
        if ctx in self._contexts:
            raise DuplicateContext(f"context '{ctx}' is already open", context=ctx)
        if len(self._contexts) >= self._limits.max_contexts:
            raise TooManyContexts(
                f"at most {self._limits.max_contexts} contexts per connection", context=ctx)
        if start.format not in AUDIO_FORMATS:
            raise UnsupportedFormat(
                f"format '{start.format}' is not one of {', '.join(AUDIO_FORMATS)}", context=ctx)
        if start.sample_rate not in SAMPLE_RATES:
            raise UnsupportedFormat(
                f"sample_rate {start.sample_rate} is not one of "
                f"{', '.join(map(str, SAMPLE_RATES))}", context=ctx)
        if start.frame_ms not in FRAME_MS:
            raise UnsupportedFormat(
                f"frame_ms {start.frame_ms} is not one of {', '.join(map(str, FRAME_MS))}",
                context=ctx)
        voice = self._resolve_voice(start.voice, ctx)
        stream = self._allocate_stream()
        self._contexts[ctx] = _Context(stream=stream)
        self._finished.pop(ctx, None)
        return [OpenContext(start=start, voice=voice, stream=stream)]

    def _resolve_voice(self, requested: str | None, ctx: str) -> str:
        if requested is None or requested == "":
            return self._default_voice
        name = self._aliases.get(requested, requested)
        if name not in self._voices:
            prefix, sep, _ = requested.partition(":")
            if sep and self._families and prefix not in self._families:
                raise UnknownVoice(
                    f"unknown voice '{requested}': no voice family '{prefix}'; the families "
                    f"are {', '.join(self._families)}", context=ctx)
            raise UnknownVoice(
                f"unknown voice {echo(requested)}; GET /v1/voices lists them", context=ctx)
        return name

    def _allocate_stream(self) -> int:
        in_use = {c.stream for c in self._contexts.values()}
        for _ in range(65536):
            stream = self._next_stream
            self._next_stream = (self._next_stream + 1) % 65536
            if stream not in in_use:
                return stream
        raise TooManyContexts("no free stream number")  # unreachable: max_contexts < 65536


def error_message(err: RtError) -> ErrorMessage:
    """The one place an RtError becomes a protocol ``error`` message."""
    return ErrorMessage(code=err.code.value, message=err.message, context=err.context,
                        retry_after_ms=err.retry_after_ms, request_id=err.request_id)


def close_for(err: RtError) -> CloseConnection | None:
    """The close that must follow ``err``, if any."""
    if err.close_code is None:
        return None
    return CloseConnection(code=err.close_code, reason=err.code.value)


__all__ = ["Action", "CloseCode", "Session", "SessionLimits", "close_for", "error_message"]
