"""Both directions of PROTOCOL.md in one module: what one side encodes, the other parses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserver.errors import ProtocolViolation, UnknownMessageType
from rtserver.protocol.messages import (
    SERVER_MESSAGE_TYPES,
    BufferHint,
    Cancel,
    Cancelled,
    ClientMessage,
    Done,
    End,
    ErrorMessage,
    Flush,
    Limits,
    Played,
    Ready,
    SegmentStarted,
    ServerMessage,
    Start,
    Started,
    Text,
    VoiceCapabilities,
    VoiceDescription,
    Words,
    WordSpan,
    encode_client_message,
    encode_server_message,
    parse_client_message,
    parse_server_message,
)

SERVER_MESSAGES: list[ServerMessage] = [
    Ready(server="rtserver/0.1.0", voices=("piper:a", "piper:b"),
          limits=Limits(max_message_bytes=65536, max_text_chars=20000, max_contexts=16),
          default_voice="piper:a"),
    Ready(server="rtserver/0.2.0", voices=("piper:a", "orpheus:alice"),
          limits=Limits(max_message_bytes=65536, max_text_chars=20000, max_contexts=16),
          default_voice="piper:a", voice_info={
              "piper:a": VoiceDescription(family="piper", languages=("en_US",),
                                          sample_rate=22050),
              "orpheus:alice": VoiceDescription(
                  family="orpheus", languages=("en",), sample_rate=24000,
                  capabilities=VoiceCapabilities(word_timing="model", lexicon=("alias",),
                                                 ssml=("break", "sub"),
                                                 control_tokens=("[laugh]",), speed=True,
                                                 lora=True))}),
    Started(context="c1", stream=7, format="opus", sample_rate=48000, frame_ms=20,
            pre_skip=312, voice="piper:a"),
    Started(context="c2", stream=65535, format="pcm_s16le", sample_rate=16000, frame_ms=60,
            pre_skip=0, channels=1),
    SegmentStarted(context="c1", index=0, text="Hello there,", source=(0, 12), seq=0),
    BufferHint(context="c1", prebuffer_ms=120.0, rtf=0.25, ahead_ms=300.0),
    Words(context="c1", segment=0, timing="model", words=(
        WordSpan(text="Hello", start_ms=12.5, end_ms=310.0, source=(0, 5)),
        WordSpan(text="there,", start_ms=330.0, end_ms=640.0, source=(6, 12)))),
    Done(context="c1", frames=50, audio_ms=1000.0, ttfa_ms=42.5, spoken_text="Hello there,"),
    Done(context="c2", frames=0, audio_ms=0.0, ttfa_ms=None),
    Cancelled(context="c1", last_seq=-1),
    ErrorMessage(code="text_too_long", message="too long", context="c1"),
    ErrorMessage(code="overloaded", message="slow down", retry_after_ms=500),
]

CLIENT_MESSAGES: list[ClientMessage] = [
    Start(context="c1"),
    Start(context="c2", voice="piper:a", format="pcm_s16le", sample_rate=24000, frame_ms=40),
    Text(context="c1", text="Hello, \u00e9t\u00e9 \U0001f600 "),
    Flush(context="c1"),
    End(context="c1"),
    Cancel(context="c1"),
    Played(context="c1", audio_ms=1234.5),
]


def test_the_samples_cover_every_server_message_type() -> None:
    """A server message type added to the protocol needs a round-trip sample here."""
    assert {m.type for m in SERVER_MESSAGES} == set(SERVER_MESSAGE_TYPES)


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=lambda m: m.type)
def test_every_server_message_round_trips_from_the_servers_encoder(
        message: ServerMessage) -> None:
    """The client parses what the server encodes into the very same message."""
    text = encode_server_message(message)
    assert json.loads(text)["type"] == message.type
    assert parse_server_message(text) == message
    assert parse_server_message(text.encode()) == message  # bytes read the same


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: type(m).__name__)
def test_every_client_message_round_trips_to_the_servers_parser(
        message: ClientMessage) -> None:
    """The server parses what the client encodes into the very same message."""
    assert parse_client_message(encode_client_message(message)) == message


TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)  # no lone surrogate
INT = st.integers(-(2**31), 2**32)
MS = st.floats(allow_nan=False, allow_infinity=False)
ANY_SERVER_MESSAGE = st.one_of(
    st.builds(Ready, server=TEXT, voices=st.lists(TEXT, max_size=4).map(tuple),
              limits=st.builds(Limits, max_message_bytes=INT, max_text_chars=INT,
                               max_contexts=INT), default_voice=TEXT, protocol=INT),
    st.builds(Started, context=TEXT, stream=INT, format=TEXT, sample_rate=INT,
              frame_ms=INT, pre_skip=INT, voice=TEXT, channels=INT),
    st.builds(SegmentStarted, context=TEXT, index=INT, text=TEXT,
              source=st.tuples(INT, INT), seq=INT),
    st.builds(BufferHint, context=TEXT, prebuffer_ms=MS, rtf=MS, ahead_ms=MS),
    st.builds(Done, context=TEXT, frames=INT, audio_ms=MS, ttfa_ms=st.none() | MS,
              spoken_text=TEXT),
    st.builds(Cancelled, context=TEXT, last_seq=INT),
    st.builds(ErrorMessage, code=TEXT, message=TEXT, context=st.none() | TEXT,
              retry_after_ms=st.none() | INT),
)


@given(ANY_SERVER_MESSAGE)
def test_any_server_message_with_finite_numbers_round_trips(message: ServerMessage) -> None:
    """Whatever the field values, the client reads back what the server wrote."""
    assert parse_server_message(encode_server_message(message)) == message


def test_a_start_without_a_voice_leaves_the_field_out() -> None:
    """``voice`` is optional on the wire: the client does not send ``null``."""
    assert "voice" not in json.loads(encode_client_message(Start(context="c")))


def test_unknown_fields_are_ignored() -> None:
    """PROTOCOL.md: a server may add fields; a reader ignores them."""
    msg = parse_server_message(json.dumps({
        "type": "cancelled", "context": "x", "last_seq": 4, "new_field": [1, 2],
        "nested": {"deep": True}}))
    assert msg == Cancelled(context="x", last_seq=4)


def test_null_reads_as_a_field_left_out() -> None:
    """An optional field sent as ``null`` takes its default."""
    msg = parse_server_message(json.dumps({
        "type": "error", "code": "internal", "message": "x", "context": None,
        "retry_after_ms": None}))
    assert msg == ErrorMessage(code="internal", message="x")


def test_a_fractional_retry_after_ms_reads_as_whole_milliseconds() -> None:
    """``retry_after_ms`` sent as a float is read as an int, not refused."""
    msg = parse_server_message('{"type": "error", "code": "overloaded", "message": "m", '
                               '"retry_after_ms": 500.7}')
    assert msg == ErrorMessage(code="overloaded", message="m", retry_after_ms=500)


def test_an_unknown_type_is_refused_by_name() -> None:
    """A type this version does not know raises ``UnknownMessageType`` naming it."""
    with pytest.raises(UnknownMessageType) as info:
        parse_server_message('{"type": "telemetry", "x": 1}')
    assert info.value.kind == "telemetry"
    assert "telemetry" in str(info.value)
    assert isinstance(info.value, ProtocolViolation)


def test_ready_accepts_voice_objects_as_well_as_names() -> None:
    """``ready.voices`` holds names; voice objects are read as their ``name``."""
    msg = parse_server_message(json.dumps({
        "type": "ready", "protocol": 1, "server": "s", "voices": [{"name": "v1"}, "v2"],
        "limits": {"max_message_bytes": 1, "max_text_chars": 2, "max_contexts": 3}}))
    assert isinstance(msg, Ready)
    assert msg.voices == ("v1", "v2")


@pytest.mark.parametrize(("raw", "says"), [
    ("not json", "not JSON"),
    ("[1, 2]", "not an object"),
    ('{"no_type": 1}', "without a 'type'"),
    ('{"type": 3}', "without a 'type'"),
    ('{"type": "started", "context": "c"}', "stream"),
    ('{"type": "cancelled", "context": "c", "last_seq": "3"}', "last_seq"),
    ('{"type": "cancelled", "context": "c", "last_seq": true}', "last_seq"),
    ('{"type": "done", "context": "c", "frames": 1.5, "audio_ms": 30}', "frames"),
    ('{"type": "segment", "context": "c", "index": 0, "text": "a", "source": [0], "seq": 0}',
     "source"),
    ('{"type": "buffer", "context": "c", "prebuffer_ms": "x", "rtf": 1, "ahead_ms": 0}',
     "prebuffer_ms"),
    ('{"type": "ready", "voices": "v", "limits": {}}', "voices"),
    ('{"type": "ready", "voices": [], "limits": {"max_contexts": 3}}', "max_message_bytes"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
])
def test_malformed_server_messages_raise_protocol_violation_naming_the_fault(
        raw: str, says: str) -> None:
    """A known type with a missing or mistyped field names the field."""
    with pytest.raises(ProtocolViolation) as info:
        parse_server_message(raw)
    assert not isinstance(info.value, UnknownMessageType)
    assert says in str(info.value)


def test_ready_from_an_older_or_newer_server_still_parses() -> None:
    """A `ready` without `voice_info` reads as none; capabilities a later
    server adds, and word timings it names otherwise, are read without error."""
    old = parse_server_message(json.dumps({
        "type": "ready", "protocol": 1, "voices": ["piper:a"],
        "limits": {"max_message_bytes": 1, "max_text_chars": 1, "max_contexts": 1}}))
    assert isinstance(old, Ready) and old.voice_info == {}
    new = parse_server_message(json.dumps({
        "type": "ready", "protocol": 1, "voices": ["piper:a"],
        "limits": {"max_message_bytes": 1, "max_text_chars": 1, "max_contexts": 1},
        "voice_info": {"piper:a": {"family": "piper", "languages": ["en"], "sample_rate": 22050,
                                   "extra": 1, "capabilities": {"word_timing": "aligned",
                                                                "emotions": ["happy"]}}}}))
    assert isinstance(new, Ready)
    caps = new.voice_info["piper:a"].capabilities
    assert caps.word_timing == "aligned" and caps.lora is False and caps.ssml == ()
