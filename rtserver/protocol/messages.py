"""Typed, frozen messages of protocol version 1 (PROTOCOL.md, Messages).

``parse_client_message`` turns one JSON text frame into a client message or
raises ``BadMessage``; ``encode_server_message`` turns a server message into
the JSON text frame. Field limits that depend on configuration (text length,
context count) are checked by the session, not here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rtserver.errors import BadMessage

PROTOCOL_VERSION = 1
AudioFormat = Literal["opus", "pcm_s16le"]
AUDIO_FORMATS: tuple[str, ...] = ("opus", "pcm_s16le")
SAMPLE_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)
FRAME_MS: tuple[int, ...] = (10, 20, 40, 60)
MAX_CONTEXT_ID_CHARS = 64


# --- client -> server -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    context: str
    voice: str | None = None
    format: str = "opus"
    sample_rate: int = 48000
    frame_ms: int = 20


@dataclass(frozen=True, slots=True)
class Text:
    context: str
    text: str


@dataclass(frozen=True, slots=True)
class Flush:
    context: str


@dataclass(frozen=True, slots=True)
class End:
    context: str


@dataclass(frozen=True, slots=True)
class Cancel:
    context: str


@dataclass(frozen=True, slots=True)
class Played:
    context: str
    audio_ms: float


ClientMessage = Start | Text | Flush | End | Cancel | Played


# --- server -> client -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Limits:
    max_message_bytes: int
    max_text_chars: int
    max_contexts: int


@dataclass(frozen=True, slots=True)
class Ready:
    server: str
    voices: tuple[str, ...]
    limits: Limits
    default_voice: str = ""
    protocol: int = PROTOCOL_VERSION
    type: str = field(default="ready", init=False)


@dataclass(frozen=True, slots=True)
class Started:
    context: str
    stream: int
    format: str
    sample_rate: int
    frame_ms: int
    pre_skip: int
    voice: str = ""
    channels: int = 1
    type: str = field(default="started", init=False)


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    context: str
    index: int
    text: str
    source: tuple[int, int]
    seq: int
    type: str = field(default="segment", init=False)


@dataclass(frozen=True, slots=True)
class BufferHint:
    context: str
    prebuffer_ms: float
    rtf: float
    ahead_ms: float
    type: str = field(default="buffer", init=False)


@dataclass(frozen=True, slots=True)
class Done:
    context: str
    frames: int
    audio_ms: float
    ttfa_ms: float | None
    spoken_text: str = ""
    type: str = field(default="done", init=False)


@dataclass(frozen=True, slots=True)
class Cancelled:
    context: str
    last_seq: int  # -1 when no frame was ever sent
    type: str = field(default="cancelled", init=False)


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    code: str
    message: str
    context: str | None = None
    retry_after_ms: int | None = None
    type: str = field(default="error", init=False)


ServerMessage = Ready | Started | SegmentStarted | BufferHint | Done | Cancelled | ErrorMessage


def encode_server_message(message: ServerMessage) -> str:
    """JSON text frame for ``message``; ``None`` optional fields are left out."""
    body = {k: v for k, v in asdict(message).items() if v is not None}
    if isinstance(message, SegmentStarted):
        body["source"] = list(message.source)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# --- parsing ----------------------------------------------------------------

def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...],
           *, required: bool = True, default: Any = None) -> Any:
    if name not in obj or obj[name] is None:
        if required:
            raise BadMessage(f"missing field '{name}'", context=_context_of(obj))
        return default
    value = obj[name]
    # bool is an int in Python; never accept it where a number is asked for
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise BadMessage(f"field '{name}' has the wrong type", context=_context_of(obj))
    if not isinstance(value, kind):
        raise BadMessage(f"field '{name}' has the wrong type", context=_context_of(obj))
    return value


def _context_of(obj: dict[str, Any]) -> str | None:
    ctx = obj.get("context")
    return ctx if isinstance(ctx, str) and 0 < len(ctx) <= MAX_CONTEXT_ID_CHARS else None


def _context(obj: dict[str, Any]) -> str:
    ctx: str = _field(obj, "context", str)
    if not 1 <= len(ctx) <= MAX_CONTEXT_ID_CHARS:
        raise BadMessage(f"'context' must be 1-{MAX_CONTEXT_ID_CHARS} characters")
    return ctx


def parse_client_message(data: str) -> ClientMessage:
    """Parse one text frame; raise ``BadMessage`` naming what is wrong."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadMessage("a message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise BadMessage("missing field 'type'", context=_context_of(obj))
    if kind == "start":
        return Start(
            context=_context(obj),
            voice=_field(obj, "voice", str, required=False),
            format=_field(obj, "format", str, required=False, default="opus"),
            sample_rate=_field(obj, "sample_rate", int, required=False, default=48000),
            frame_ms=_field(obj, "frame_ms", int, required=False, default=20),
        )
    if kind == "text":
        return Text(context=_context(obj), text=_field(obj, "text", str))
    if kind == "flush":
        return Flush(context=_context(obj))
    if kind == "end":
        return End(context=_context(obj))
    if kind == "cancel":
        return Cancel(context=_context(obj))
    if kind == "played":
        ms = _field(obj, "audio_ms", (int, float))
        if ms < 0:
            raise BadMessage("'audio_ms' must be >= 0", context=_context_of(obj))
        return Played(context=_context(obj), audio_ms=float(ms))
    raise BadMessage(f"unknown message type '{kind}'", context=_context_of(obj))
