"""Hostile input to the parser and the encoder: every failure is a
``bad_message``, and nothing the server writes can fail to encode."""

from __future__ import annotations

import json
import math

import pytest

from rtserver.errors import BadMessage
from rtserver.protocol.messages import (
    ECHO_CHARS,
    BufferHint,
    Done,
    ErrorMessage,
    SegmentStarted,
    echo,
    encode_server_message,
    parse_client_message,
)
from rtserver.protocol.session import Reply, Session, SessionLimits

LONE = "\\ud800"  # a JSON escape of a lone surrogate, as a client sends it
HUGE = "9" * 5000  # past Python's 4,300-digit int conversion limit

# Every field of every client message (PROTOCOL.md), with a valid value.
VALID = {
    "start": {"context": "c", "voice": "v", "format": "opus", "sample_rate": 48000,
              "frame_ms": 20},
    "text": {"context": "c", "text": "hello"},
    "flush": {"context": "c"},
    "end": {"context": "c"},
    "cancel": {"context": "c"},
    "played": {"context": "c", "audio_ms": 120},
}
# Values of every JSON type; each is wrong for some field.
WRONG = [None, True, 0, -1, 1.5, "s", "", [], {}, [1, "x"], {"a": 1}]


def raw_with(kind: str, name: str, raw_value: str) -> str:
    """The message as JSON text with ``name`` set to ``raw_value`` verbatim."""
    body = dict(VALID[kind])
    body["type"] = kind
    body[name] = "__X__"
    return json.dumps(body).replace('"__X__"', raw_value)


@pytest.mark.parametrize("kind", list(VALID))
def test_a_valid_message_parses(kind: str) -> None:
    msg = parse_client_message(json.dumps({"type": kind, **VALID[kind]}))
    assert msg.context == "c"


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, fields in VALID.items()
                                              for n in [*fields, "type", "extra"]])
def test_a_lone_surrogate_in_any_field_is_bad_message(kind: str, name: str) -> None:
    with pytest.raises(BadMessage):
        parse_client_message(raw_with(kind, name, f'"a{LONE}b"'))
    with pytest.raises(BadMessage):  # nested, and as a key
        parse_client_message(raw_with(kind, name, f'{{"k": ["{LONE}"]}}')
                             .replace('"k"', f'"{LONE}"'))


def test_a_surrogate_pair_is_text_not_an_error() -> None:
    msg = parse_client_message('{"type":"text","context":"c","text":"\\ud83d\\ude00"}')
    assert msg.text == "\U0001f600"  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, fields in VALID.items()
                                              for n in [*fields, "extra"]])
def test_a_huge_number_in_any_field_is_bad_message(kind: str, name: str) -> None:
    with pytest.raises(BadMessage, match="too long"):
        parse_client_message(raw_with(kind, name, HUGE))


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999", "-1",
                                 "1" + "0" * 400])
def test_played_needs_a_finite_number(raw: str) -> None:
    with pytest.raises(BadMessage):
        parse_client_message(raw_with("played", "audio_ms", raw))


@pytest.mark.parametrize("depth", [10, 2000, 30000])
def test_deep_nesting_is_bad_message_or_ignored(depth: int) -> None:
    nested = "[" * depth + "]" * depth
    raw = raw_with("text", "extra", nested)
    if depth <= 10:  # an unknown field of any shape is ignored (PROTOCOL.md)
        assert parse_client_message(raw).context == "c"
    else:
        with pytest.raises(BadMessage):
            parse_client_message(raw)


@pytest.mark.parametrize(("kind", "name", "value"),
                         [(k, n, w) for k, fields in VALID.items() for n in fields
                          for w in WRONG])
def test_every_field_with_every_wrong_type(kind: str, name: str, value: object) -> None:
    body = {"type": kind, **VALID[kind], name: value}
    good = VALID[kind][name]
    optional = kind == "start" and name != "context"
    same_type = type(value) is type(good) or (name == "audio_ms" and type(value) is float)
    try:
        parse_client_message(json.dumps(body))
    except BadMessage as err:
        assert err.code.value == "bad_message"
        json.dumps(err.message).encode()  # the message is sendable
    else:  # only a value of the right type (or null for an optional field) passes
        assert same_type or (optional and value is None), (name, value)


def test_garbage_and_non_objects() -> None:
    for raw in ["", "{", "[]", "1", '"x"', "null", '{"type": 1}', '{"type": "x" ',
                "\x00", '{"type":"start","context":"c"}garbage']:
        with pytest.raises(BadMessage):
            parse_client_message(raw)


def test_echo_is_short_escaped_and_encodable() -> None:
    out = echo("\ud800" + "x" * 500)
    assert len(out) <= ECHO_CHARS * 6 + 10
    out.encode("utf-8")
    assert "\\ud800" in out
    assert echo(12) == "'int'"


def test_an_unknown_type_is_echoed_safely_by_the_session() -> None:
    s = Session(SessionLimits(max_text_chars=10, max_contexts=2), voices=["v"],
                default_voice="v")
    big = "q" * 10_000
    [reply] = s.receive_text(json.dumps({"type": big}))
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage)
    assert reply.message.code == "bad_message"
    assert len(reply.message.message) < 200
    [reply] = s.receive_text(json.dumps({"type": "start", "context": "c", "voice": big}))
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage)
    assert reply.message.code == "unknown_voice" and len(reply.message.message) < 200


def test_encoding_never_fails_and_is_utf8() -> None:
    for message in [
        ErrorMessage(code="internal", message="bad \ud800 text", context="c\udfff"),
        SegmentStarted(context="c", index=0, text="\ud83d", source=(0, 1), seq=0),
        Done(context="c", frames=1, audio_ms=math.nan, ttfa_ms=math.inf, spoken_text="\udc00"),
        BufferHint(context="c", prebuffer_ms=math.nan, rtf=0.5, ahead_ms=-math.inf),
    ]:
        text = encode_server_message(message)
        text.encode("utf-8")  # strict: raises on a lone surrogate
        body = json.loads(text)  # valid JSON: no NaN or Infinity
        assert body["type"] == message.type
    body = json.loads(encode_server_message(
        ErrorMessage(code="internal", message="a\ud800b")))
    assert body["message"] == "a\ufffdb"
    done = json.loads(encode_server_message(
        Done(context="c", frames=1, audio_ms=math.nan, ttfa_ms=12.5)))
    assert "audio_ms" not in done and done["ttfa_ms"] == 12.5
