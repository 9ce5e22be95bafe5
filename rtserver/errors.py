"""One error hierarchy; each error carries its PROTOCOL.md code.

The mapping to wire codes lives here and nowhere else: raise the subclass,
and the session turns it into an ``error`` message (and, for some, a close).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Error codes from PROTOCOL.md, section Messages."""

    BAD_MESSAGE = "bad_message"
    UNKNOWN_CONTEXT = "unknown_context"
    DUPLICATE_CONTEXT = "duplicate_context"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    TEXT_TOO_LONG = "text_too_long"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNKNOWN_VOICE = "unknown_voice"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    ENGINE_FAILED = "engine_failed"
    INTERNAL = "internal"
    # rtserver's (docs/PROTOCOL-EXTENSIONS.md, "Pronunciation, SSML and speed")
    LEXICON_TOO_LARGE = "lexicon_too_large"
    UNSUPPORTED_SSML = "unsupported_ssml"


class CloseCode:
    """WebSocket close codes from PROTOCOL.md."""

    NORMAL = 1000
    GOING_AWAY = 1001
    INVALID_DATA = 1007
    POLICY = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL = 1011
    TRY_AGAIN_LATER = 1013


class RtError(Exception):
    """Base of every error rtserver reports to a client."""

    code: ErrorCode = ErrorCode.INTERNAL
    close_code: int | None = None  # set when the connection must close after it

    def __init__(self, message: str, *, context: str | None = None,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        self.retry_after_ms = retry_after_ms
        # the id of the request or context it is about (echoed in the error)
        self.request_id: str | None = None


class BadMessage(RtError):
    code = ErrorCode.BAD_MESSAGE


class UnknownContext(RtError):
    code = ErrorCode.UNKNOWN_CONTEXT


class DuplicateContext(RtError):
    code = ErrorCode.DUPLICATE_CONTEXT


class TooManyContexts(RtError):
    code = ErrorCode.TOO_MANY_CONTEXTS


class TextTooLong(RtError):
    code = ErrorCode.TEXT_TOO_LONG


class UnsupportedFormat(RtError):
    code = ErrorCode.UNSUPPORTED_FORMAT


class LexiconTooLarge(RtError):
    """A lexicon past its bounds (entries, grapheme or value length)."""

    code = ErrorCode.LEXICON_TOO_LARGE


class UnsupportedSsml(RtError):
    """An SSML element or attribute outside the subset the voice honours."""

    code = ErrorCode.UNSUPPORTED_SSML


class UnknownVoice(RtError):
    code = ErrorCode.UNKNOWN_VOICE


class BadAdapter(UnknownVoice):
    """A LoRA adapter that cannot serve: its folder is missing, it is not in
    PEFT layout, or the engine refused it (rank, modules, shapes); the message
    says why. A voice on it is an ``unknown_voice``."""


class RateLimited(RtError):
    """A per-key (or per-address) token bucket is empty; ``retry_after_ms`` says
    when it holds enough again. Nothing else is affected."""

    code = ErrorCode.RATE_LIMITED


class Overloaded(RtError):
    """The client stayed behind past the backpressure limit: error, then 1013."""

    code = ErrorCode.OVERLOADED
    close_code = CloseCode.TRY_AGAIN_LATER


class Busy(RtError):
    """A new context is refused (the server drains, or admitting it would miss
    the first-heard-audio target); the connection and its contexts go on."""

    code = ErrorCode.OVERLOADED


class ControlFlood(RtError):
    """The client sent messages faster than it reads their replies, or faster
    than the per-connection message rate: error, then 1008."""

    code = ErrorCode.RATE_LIMITED
    close_code = CloseCode.POLICY


class EngineFailed(RtError):
    """The voice or engine failed for one context; other contexts go on."""

    code = ErrorCode.ENGINE_FAILED


class EngineDead(EngineFailed):
    """The engine behind a voice is gone (vLLM's ``EngineDeadError``, a torch
    engine's crashed thread): this context fails, the voice stays down, and the
    server drains and exits non-zero so that its orchestrator restarts it."""


class EngineLost(EngineFailed):
    """The GPU worker process serving the voice went away (killed, crashed):
    this context fails, the voice is down until a worker is back (its
    supervisor restarts it); not the voice's fault, so no circuit breaker
    counts it."""


class EngineUnavailable(EngineFailed):
    """The voice's circuit breaker is open (or its engine is dead): new contexts
    fail fast; ``retry_after_ms`` when a probe will be let through."""


class InternalError(RtError):
    code = ErrorCode.INTERNAL


class ConfigError(Exception):
    """Invalid configuration at start-up (never sent to a client)."""


# --- what a client finds wrong with the server (never sent on the wire) ---------

class RtClientError(Exception):
    """Base of the errors rtserver's client raises (``rtserver.client`` re-exports it)."""


class ProtocolViolation(RtClientError):
    """The server broke PROTOCOL.md: a text frame that is not a JSON object, a
    known message with a missing or mistyped field, a bad binary frame, an
    unknown stream, frames out of order."""


class SeqGapError(ProtocolViolation):
    """Frames of a context were not consecutive: audio was lost."""

    def __init__(self, context: str, expected: int, got: int) -> None:
        super().__init__(f"context '{context}': expected frame seq {expected}, got {got} "
                         f"({got - expected} frames missing)" if got > expected else
                         f"context '{context}': expected frame seq {expected}, got {got} "
                         "(repeated or out of order)")
        self.context = context
        self.expected = expected
        self.got = got


class UnknownMessageType(ProtocolViolation):
    """A server message of a type this version does not know. PROTOCOL.md lets
    the server add types, so the client skips it; a strict reader may not."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"unknown server message type {kind[:40]!a}")
        self.kind = kind
