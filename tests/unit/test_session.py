"""The sans-I/O session: every client message, every error code, no sockets."""

from __future__ import annotations

import json

import pytest

from rtserver.protocol.messages import Cancelled, ErrorMessage, Start
from rtserver.protocol.session import (
    CancelContext,
    EndContext,
    FeedText,
    FlushContext,
    ListenerProgress,
    OpenContext,
    Reply,
    Session,
    SessionLimits,
)

VOICE = "piper:test"


def make(max_text_chars: int = 100, max_contexts: int = 2) -> Session:
    return Session(SessionLimits(max_text_chars=max_text_chars, max_contexts=max_contexts),
                   voices=[VOICE, "piper:other"], default_voice=VOICE,
                   voice_aliases={"test": VOICE})


def send(session: Session, **msg: object) -> list[object]:
    return list(session.receive_text(json.dumps(msg)))


def error_code(actions: list[object]) -> str:
    assert len(actions) == 1, actions
    reply = actions[0]
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage), actions
    return reply.message.code


def test_start_opens_with_defaults_and_default_voice() -> None:
    s = make()
    [action] = send(s, type="start", context="a")
    assert isinstance(action, OpenContext)
    assert action.start == Start(context="a")
    assert action.voice == VOICE
    assert s.open_contexts == ["a"]


def test_voice_alias_and_stream_numbers_are_distinct() -> None:
    s = make()
    [a] = send(s, type="start", context="a", voice="test")
    [b] = send(s, type="start", context="b", voice="piper:other")
    assert isinstance(a, OpenContext) and isinstance(b, OpenContext)
    assert a.voice == VOICE and b.voice == "piper:other"
    assert a.stream != b.stream


def test_text_flush_end_flow() -> None:
    s = make()
    send(s, type="start", context="a")
    assert send(s, type="text", context="a", text="Hel") == [FeedText("a", "Hel")]
    assert send(s, type="flush", context="a") == [FlushContext("a")]
    assert send(s, type="end", context="a") == [EndContext("a")]
    assert error_code(send(s, type="text", context="a", text="more")) == "bad_message"


def test_empty_text_is_accepted_and_ignored() -> None:
    s = make()
    send(s, type="start", context="a")
    assert send(s, type="text", context="a", text="") == []


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "42", '{"context": "a"}',
                                 '{"type": 5}', '{"type": "sing", "context": "a"}'])
def test_malformed_messages_are_bad_message(raw: str) -> None:
    assert error_code(make().receive_text(raw)) == "bad_message"


@pytest.mark.parametrize("msg", [
    {"type": "start"},
    {"type": "start", "context": ""},
    {"type": "start", "context": "x" * 65},
    {"type": "start", "context": 7},
    {"type": "start", "context": "a", "sample_rate": "48000"},
    {"type": "start", "context": "a", "frame_ms": True},
    {"type": "text", "context": "a"},
    {"type": "text", "context": "a", "text": 3},
    {"type": "played", "context": "a", "audio_ms": -1},
    {"type": "played", "context": "a"},
])
def test_missing_or_wrong_fields_are_bad_message(msg: dict[str, object]) -> None:
    s = make()
    send(s, type="start", context="a") if msg.get("type") != "start" else None
    assert error_code(send(s, **msg)) == "bad_message"


def test_binary_from_client_is_bad_message() -> None:
    assert error_code(make().receive_binary(b"\x00\x01")) == "bad_message"


@pytest.mark.parametrize("kind", ["text", "flush", "end", "cancel", "played"])
def test_unknown_context(kind: str) -> None:
    extra: dict[str, object] = {"text": "hi"} if kind == "text" else {}
    if kind == "played":
        extra = {"audio_ms": 10}
    actions = send(make(), type=kind, context="nope", **extra)
    assert error_code(actions) == "unknown_context"
    reply = actions[0]
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage)
    assert reply.message.context == "nope"


def test_duplicate_and_too_many_contexts() -> None:
    s = make(max_contexts=2)
    send(s, type="start", context="a")
    assert error_code(send(s, type="start", context="a")) == "duplicate_context"
    send(s, type="start", context="b")
    assert error_code(send(s, type="start", context="c")) == "too_many_contexts"
    s.context_finished("a", last_seq=3)
    [action] = send(s, type="start", context="c")
    assert isinstance(action, OpenContext)


def test_text_over_the_limit_is_refused_and_context_keeps_working() -> None:
    s = make(max_text_chars=10)
    send(s, type="start", context="a")
    assert send(s, type="text", context="a", text="12345") == [FeedText("a", "12345")]
    assert error_code(send(s, type="text", context="a", text="123456")) == "text_too_long"
    assert send(s, type="text", context="a", text="12345") == [FeedText("a", "12345")]


@pytest.mark.parametrize("field,value", [("format", "mp3"), ("sample_rate", 44100),
                                         ("frame_ms", 25)])
def test_unsupported_format(field: str, value: object) -> None:
    assert error_code(send(make(), type="start", context="a", **{field: value})) \
        == "unsupported_format"


def test_unknown_voice() -> None:
    assert error_code(send(make(), type="start", context="a", voice="nobody")) \
        == "unknown_voice"


def test_cancel_once_then_late_cancel_repeats_fence() -> None:
    s = make()
    send(s, type="start", context="a")
    assert send(s, type="cancel", context="a") == [CancelContext("a")]
    assert send(s, type="cancel", context="a") == []  # first reply is on its way
    assert send(s, type="text", context="a", text="late") == []  # moot, no error
    s.context_finished("a", last_seq=41)
    assert send(s, type="cancel", context="a") == [Reply(Cancelled(context="a", last_seq=41))]


def test_played_is_reported_and_accepted_after_done() -> None:
    s = make()
    send(s, type="start", context="a")
    assert send(s, type="played", context="a", audio_ms=120.5) == [ListenerProgress("a", 120.5)]
    s.context_finished("a", last_seq=9)
    # no error after done; still reported (the listener plays on: first heard audio)
    assert send(s, type="played", context="a", audio_ms=180.0) == [ListenerProgress("a", 180.0)]


def test_errors_leave_other_contexts_working() -> None:
    s = make()
    send(s, type="start", context="a")
    for bad in ("{", '{"type":"text","context":"zzz","text":"x"}',
                '{"type":"start","context":"a"}'):
        s.receive_text(bad)
    assert send(s, type="text", context="a", text="still here") == [FeedText("a", "still here")]
    assert s.open_contexts == ["a"]


def test_forget_frees_a_refused_start_and_refund_gives_chars_back() -> None:
    s = make(max_text_chars=10)
    [action] = send(s, type="start", context="a")
    assert isinstance(action, OpenContext)
    s.forget("a")  # the shell refused it (say, rate limited)
    assert s.open_contexts == []
    assert error_code(send(s, type="end", context="a")) == "unknown_context"
    assert error_code(send(s, type="cancel", context="a")) == "unknown_context"
    send(s, type="start", context="b")
    assert send(s, type="text", context="b", text="1234567890") == [FeedText("b", "1234567890")]
    s.refund("b", 10)  # the shell refused that text
    assert send(s, type="text", context="b", text="abcdefghij") == [FeedText("b", "abcdefghij")]
