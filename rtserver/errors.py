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


class CloseCode:
    """WebSocket close codes from PROTOCOL.md."""

    NORMAL = 1000
    GOING_AWAY = 1001
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


class UnknownVoice(RtError):
    code = ErrorCode.UNKNOWN_VOICE


class RateLimited(RtError):
    code = ErrorCode.RATE_LIMITED


class Overloaded(RtError):
    """The client stayed behind past the backpressure limit: error, then 1013."""

    code = ErrorCode.OVERLOADED
    close_code = CloseCode.TRY_AGAIN_LATER


class EngineFailed(RtError):
    """The voice or engine failed for one context; other contexts go on."""

    code = ErrorCode.ENGINE_FAILED


class InternalError(RtError):
    code = ErrorCode.INTERNAL


class ConfigError(Exception):
    """Invalid configuration at start-up (never sent to a client)."""
