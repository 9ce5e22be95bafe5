"""Typed, frozen messages of protocol version 1, both directions (PROTOCOL.md, Messages).

Server side: ``parse_client_message`` turns one JSON text frame into a client
message or raises ``BadMessage`` (for every input: numbers Python will not
convert, nesting deeper than the parser's recursion limit, escaped lone
surrogates, ``NaN``); ``encode_server_message`` turns a server message into
the JSON text frame, always valid UTF-8 JSON. Field limits that depend on
configuration (text length, context count) are checked by the session, not
here. Client strings quoted in error messages go through ``echo`` (short,
escaped).

Client side: ``encode_client_message`` writes a client message;
``parse_server_message`` reads a server text frame into the same types the
server encoded, or raises ``ProtocolViolation`` (``UnknownMessageType`` for a
type this version does not know).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import msgspec

from rtserver.errors import BadMessage, ProtocolViolation, UnknownMessageType

PROTOCOL_VERSION = 1
AudioFormat = Literal["opus", "pcm_s16le"]
AUDIO_FORMATS: tuple[str, ...] = ("opus", "pcm_s16le")
SAMPLE_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)
FRAME_MS: tuple[int, ...] = (10, 20, 40, 60)
MAX_CONTEXT_ID_CHARS = 64
TEXT_FORMATS: tuple[str, ...] = ("text", "ssml")
SPEED_MIN, SPEED_MAX = 0.5, 2.0
# A request id (``X-Request-Id``, ``start.request_id``): what headers, JSON and
# log lines carry as is.
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:/+=@-]{{1,{MAX_REQUEST_ID_CHARS}}}")


def valid_request_id(value: str) -> bool:
    """1-128 characters, each a letter, digit or one of ``._:/+=@-``."""
    return _REQUEST_ID.fullmatch(value) is not None


# --- client -> server -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LexiconEntry:
    """One ``start.lexicon`` entry, named as in W3C PLS (rtserver.text.lexicon
    says how it matches)."""

    grapheme: str
    phoneme: str | None = None
    alias: str | None = None
    case_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class Start:
    context: str
    voice: str | None = None
    format: str = "opus"
    sample_rate: int = 48000
    frame_ms: int = 20
    request_id: str | None = None  # the client's id for this context (PROTOCOL-EXTENSIONS)
    # rtserver's (docs/PROTOCOL-EXTENSIONS.md, "Pronunciation, SSML and speed")
    lexicon: tuple[LexiconEntry, ...] = ()
    speed: float | None = None
    text_format: str = "text"


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
_CLIENT_TYPES: dict[type[ClientMessage], str] = {
    Start: "start", Text: "text", Flush: "flush", End: "end", Cancel: "cancel", Played: "played",
}


# --- server -> client -------------------------------------------------------
# msgspec Structs tagged by "type": one definition serves the server's encoder
# and the client's parser (``parse_server_message``), which msgspec validates
# field by field (bool is not an int, [start, end) has two ints) instead of a
# hand-written check per field. Defaults are what a reader assumes for a field
# left out; ``None`` optional fields are left out when encoding.

class _ServerMessage(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the server's messages; ``type`` is each one's tag on the wire."""

    type: ClassVar[str]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    max_message_bytes: int
    max_text_chars: int
    max_contexts: int
    # The connection's input budget (PROTOCOL-EXTENSIONS.md): past it reading
    # pauses, and a connection held over it for a second is cut off (1008).
    # None from a server that predates them.
    messages_per_s: float | None = None
    input_bytes_per_s: int | None = None


WORD_TIMING_MODEL = "model"  # word times from the model's own durations
WORD_TIMING_ESTIMATED = "estimated"  # words spread over a segment's audio by characters


class VoiceCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a voice can do: ``ready.voice_info[voice].capabilities`` and the
    same object in ``GET /v1/voices`` (PROTOCOL-EXTENSIONS.md). Each family
    declares its voices' in ``rtserver/voices/<family>/capabilities.py``.

    Lists name what is honoured (empty: nothing), so a reader tests them for
    truth or membership. ``word_timing`` is a string, not a closed set, so a
    client reading a later server's value keeps working."""

    # "model" (the model's durations) or "estimated" (spread by characters)
    word_timing: str = WORD_TIMING_ESTIMATED
    lexicon: tuple[str, ...] = ()  # lexicon entry kinds honoured: "alias", "phoneme"
    ssml: tuple[str, ...] = ()  # SSML elements honoured: "break", "sub", "phoneme", "prosody"
    control_tokens: tuple[str, ...] = ()  # in-text tokens the model acts on ("[laugh]")
    speed: bool = False  # honours a context's speed
    lora: bool = False  # the voice is a LoRA adapter on its family's base model
    speed_range: tuple[float, float] | None = None  # (slowest, fastest) when ``speed``
    phoneme_alphabet: str | None = None  # of lexicon phonemes and <phoneme> ("ipa")


class VoiceDescription(msgspec.Struct, frozen=True, kw_only=True):
    """One voice as ``ready.voice_info`` describes it (PROTOCOL.md's planned
    shape: family, languages, sample rate, capabilities)."""

    family: str
    languages: tuple[str, ...]
    sample_rate: int  # the voice's native rate in Hz (``start`` may ask for another)
    capabilities: VoiceCapabilities = VoiceCapabilities()


class Ready(_ServerMessage, frozen=True, kw_only=True, tag="ready"):
    type: ClassVar[str] = "ready"
    server: str = ""
    voices: tuple[str, ...]
    limits: Limits
    default_voice: str = ""
    protocol: int = PROTOCOL_VERSION
    request_id: str | None = None  # the connection's (its handshake's X-Request-Id)
    # voice name -> what it is and can do (empty from a server that predates it)
    voice_info: dict[str, VoiceDescription] = msgspec.field(default_factory=dict)


class Started(_ServerMessage, frozen=True, kw_only=True, tag="started"):
    type: ClassVar[str] = "started"
    context: str
    stream: int
    format: str
    sample_rate: int
    frame_ms: int
    pre_skip: int = 0
    voice: str = ""
    channels: int = 1
    request_id: str | None = None


class SegmentStarted(_ServerMessage, frozen=True, kw_only=True, tag="segment"):
    type: ClassVar[str] = "segment"
    context: str
    index: int
    text: str
    source: tuple[int, int]
    seq: int


class BufferHint(_ServerMessage, frozen=True, kw_only=True, tag="buffer"):
    type: ClassVar[str] = "buffer"
    context: str
    prebuffer_ms: float
    rtf: float
    ahead_ms: float


class Done(_ServerMessage, frozen=True, kw_only=True, tag="done"):
    type: ClassVar[str] = "done"
    context: str
    frames: int
    audio_ms: float
    ttfa_ms: float | None = None
    spoken_text: str = ""
    request_id: str | None = None


class Cancelled(_ServerMessage, frozen=True, kw_only=True, tag="cancelled"):
    type: ClassVar[str] = "cancelled"
    context: str
    last_seq: int  # -1 when no frame was ever sent
    request_id: str | None = None


class ErrorMessage(_ServerMessage, frozen=True, kw_only=True, tag="error"):
    type: ClassVar[str] = "error"
    code: str
    message: str = ""
    context: str | None = None
    retry_after_ms: int | None = None
    request_id: str | None = None


WordTiming = Literal["model", "estimated"]


class WordSpan(msgspec.Struct, frozen=True, kw_only=True):
    """One word of a ``words`` event: its text as spoken, when it is heard
    (ms from the context's first sample) and where it came from
    (``[start, end)`` offsets into the context's text as received)."""

    text: str
    start_ms: float
    end_ms: float
    source: tuple[int, int]


class Words(_ServerMessage, frozen=True, kw_only=True, tag="words"):
    """When the words of a segment are heard (PROTOCOL-EXTENSIONS.md, ``words``).

    ``timing`` "model": from the voice's own durations; "estimated": spread
    over the segment's expected audio by character count."""

    type: ClassVar[str] = "words"
    context: str
    segment: int
    timing: WordTiming
    words: tuple[WordSpan, ...]


ServerMessage = (Ready | Started | SegmentStarted | BufferHint | Words | Done | Cancelled
                 | ErrorMessage)
SERVER_MESSAGE_TYPES: dict[str, type[ServerMessage]] = {
    cls.type: cls
    for cls in (Ready, Started, SegmentStarted, BufferHint, Words, Done, Cancelled, ErrorMessage)
}


# A code point UTF-8 cannot encode: a surrogate not paired by the JSON decoder.
_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape that may decode to one (a false match only costs a check).
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")
ECHO_CHARS = 40  # client text quoted in an error message, at most


def echo(value: object) -> str:
    """``value`` as an error message may quote it: repr-escaped (no lone
    surrogate or control character survives) and cut to ``ECHO_CHARS``."""
    text = value if isinstance(value, str) else type(value).__name__
    if len(text) > ECHO_CHARS:
        text = text[:ECHO_CHARS] + "..."
    return ascii(text)


def _clean(value: Any) -> Any:
    """What JSON and UTF-8 can carry: non-finite floats become None (left
    out), lone surrogates U+FFFD."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {k: c for k, v in value.items() if (c := _clean(v)) is not None}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def encode_server_message(message: ServerMessage) -> str:
    """JSON text frame for ``message``; ``None`` optional fields are left out.
    Never raises for a well-typed message and always returns text that encodes
    as UTF-8: a non-finite float is left out, a lone surrogate becomes U+FFFD."""
    return _dump(_clean(msgspec.to_builtins(message)))


def encode_client_message(message: ClientMessage) -> str:
    """JSON text frame for a client message (what ``rtserver.client`` sends);
    ``None`` optional fields are left out."""
    body = _clean(asdict(message))
    if isinstance(message, Start):  # rtserver's fields, only when used
        if not message.lexicon:
            del body["lexicon"]
        if message.text_format == "text":
            del body["text_format"]
    return _dump({"type": _CLIENT_TYPES[type(message)], **body})


def _dump(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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


def _lexicon(obj: dict[str, Any]) -> tuple[LexiconEntry, ...]:
    raw = _field(obj, "lexicon", list, required=False, default=[])
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadMessage(f"lexicon entry {i} is not an object", context=_context_of(obj))
        try:
            entries.append(LexiconEntry(
                grapheme=_field(item, "grapheme", str),
                phoneme=_field(item, "phoneme", str, required=False),
                alias=_field(item, "alias", str, required=False),
                case_sensitive=_field(item, "case_sensitive", bool, required=False,
                                      default=False)))
        except BadMessage as exc:
            raise BadMessage(f"lexicon entry {i}: {exc.message}",
                             context=_context_of(obj)) from None
    return tuple(entries)


def _speed(obj: dict[str, Any]) -> float | None:
    value = _field(obj, "speed", (int, float), required=False)
    if value is None:
        return None
    try:
        speed = float(value)
    except OverflowError:
        speed = math.inf
    if not SPEED_MIN <= speed <= SPEED_MAX:  # NaN fails too
        raise BadMessage(f"'speed' must be {SPEED_MIN} to {SPEED_MAX}", context=_context_of(obj))
    return speed


def _context_of(obj: dict[str, Any]) -> str | None:
    ctx = obj.get("context")
    return ctx if isinstance(ctx, str) and 0 < len(ctx) <= MAX_CONTEXT_ID_CHARS else None


def _context(obj: dict[str, Any]) -> str:
    ctx: str = _field(obj, "context", str)
    if not 1 <= len(ctx) <= MAX_CONTEXT_ID_CHARS:
        raise BadMessage(f"'context' must be 1-{MAX_CONTEXT_ID_CHARS} characters")
    return ctx


def _request_id(obj: dict[str, Any]) -> str | None:
    rid: str | None = _field(obj, "request_id", str, required=False)
    if rid is not None and not valid_request_id(rid):
        raise BadMessage(f"'request_id' must be 1-{MAX_REQUEST_ID_CHARS} letters, digits or "
                         "._:/+=@-", context=_context_of(obj))
    return rid


def _reject_constant(name: str) -> Any:
    raise BadMessage(f"not JSON: {name} is not a JSON number")


def _has_lone_surrogate(obj: Any) -> bool:
    """Any string (key or value, at any depth) holding a lone surrogate.
    Iterative: the depth is whatever the decoder allowed."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _load(data: str) -> Any:
    if _SURROGATE.search(data):  # a transport that passes undecodable text
        raise BadMessage("not JSON: the text holds a lone surrogate")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BadMessage(f"not JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise BadMessage("not JSON: nested too deeply") from None
    except ValueError:  # an integer past Python's digit limit (sys.int_info)
        raise BadMessage("not JSON: a number is too long") from None
    if _ESCAPED_SURROGATE.search(data) and _has_lone_surrogate(obj):
        raise BadMessage("a string holds an escaped lone surrogate (not Unicode text)")
    return obj


def _text_format(obj: dict[str, Any]) -> str:
    value: str = _field(obj, "text_format", str, required=False, default="text")
    if value not in TEXT_FORMATS:
        raise BadMessage(f"'text_format' {echo(value)} is not one of {', '.join(TEXT_FORMATS)}",
                         context=_context_of(obj))
    return value


def parse_client_message(data: str) -> ClientMessage:
    """Parse one text frame; raise ``BadMessage`` naming what is wrong."""
    obj = _load(data)
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
            request_id=_request_id(obj),
            lexicon=_lexicon(obj),
            speed=_speed(obj),
            text_format=_text_format(obj),
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
        try:
            audio_ms = float(ms)
        except OverflowError:  # an int too large for a float
            audio_ms = math.inf
        if not (math.isfinite(audio_ms) and audio_ms >= 0):
            raise BadMessage("'audio_ms' must be a finite number >= 0",
                             context=_context_of(obj))
        return Played(context=_context(obj), audio_ms=audio_ms)
    raise BadMessage(f"unknown message type {echo(kind)}", context=_context_of(obj))


def parse_server_message(data: str | bytes) -> ServerMessage:
    """One server text frame as a typed message (the client's side of PROTOCOL.md).

    Unknown fields are ignored and ``null`` reads as a field left out
    (PROTOCOL.md: either side may add fields). A type this version does not
    know raises ``UnknownMessageType`` (a client skips it: the server may add
    types); anything else wrong (not a JSON object, a known type with a
    missing or mistyped field) raises ``ProtocolViolation`` naming it.
    """
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ProtocolViolation(f"server sent a text frame that is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation("server sent JSON that is not an object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolViolation("server message without a 'type'")
    cls = SERVER_MESSAGE_TYPES.get(kind)
    if cls is None:
        raise UnknownMessageType(kind)
    fields = {name: value for name, value in obj.items() if value is not None}
    if cls is Ready:
        fields["voices"] = _voice_names(fields.get("voices", []))
    elif cls is ErrorMessage and isinstance(retry := fields.get("retry_after_ms"), float):
        fields["retry_after_ms"] = int(retry)  # PROTOCOL.md gives no type: read 500.0 as 500
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise ProtocolViolation(f"'{kind}' message: {exc}") from None


def _voice_names(raw: Any) -> list[Any]:
    """``ready.voices`` as names: PROTOCOL.md keeps it a list of names; voice
    objects with a ``name`` are read as their name too."""
    if not isinstance(raw, list):
        raise ProtocolViolation("'ready' field 'voices' is not a list")
    return [item["name"] if isinstance(item, dict) and isinstance(item.get("name"), str)
            else item for item in raw]


__all__ = [
    "AUDIO_FORMATS",
    "FRAME_MS",
    "MAX_CONTEXT_ID_CHARS",
    "MAX_REQUEST_ID_CHARS",
    "PROTOCOL_VERSION",
    "SAMPLE_RATES",
    "SERVER_MESSAGE_TYPES",
    "SPEED_MAX",
    "SPEED_MIN",
    "TEXT_FORMATS",
    "WORD_TIMING_ESTIMATED",
    "WORD_TIMING_MODEL",
    "AudioFormat",
    "BufferHint",
    "Cancel",
    "Cancelled",
    "ClientMessage",
    "Done",
    "End",
    "ErrorMessage",
    "Flush",
    "LexiconEntry",
    "Limits",
    "Played",
    "Ready",
    "SegmentStarted",
    "ServerMessage",
    "Start",
    "Started",
    "Text",
    "VoiceCapabilities",
    "VoiceDescription",
    "WordSpan",
    "WordTiming",
    "Words",
    "echo",
    "encode_client_message",
    "encode_server_message",
    "parse_client_message",
    "parse_server_message",
    "valid_request_id",
]
