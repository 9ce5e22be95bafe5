"""A hypothesis state machine drives the sans-I/O session with valid and
hostile messages, and checks it against a model: a bad message never ends
anything or touches another context, and every reply encodes."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rtserver.errors import ErrorCode
from rtserver.protocol.messages import Cancelled, ErrorMessage, encode_server_message
from rtserver.protocol.session import (
    CancelContext,
    CloseConnection,
    EndContext,
    FeedText,
    FlushContext,
    ListenerProgress,
    OpenContext,
    Reply,
    Session,
    SessionLimits,
)

VOICE = "piper:a"
MAX_CONTEXTS = 3
MAX_CHARS = 40
NAMES = st.sampled_from(["a", "b", "c", "d"])
CODES = {c.value for c in ErrorCode}

# JSON values of every type, hostile ones included (as raw JSON text).
RAW_VALUES = st.one_of(
    st.sampled_from(['"\\ud800"', '"x\\udfff"', "9" * 4400, "NaN", "-Infinity", "1e999",
                     "[" * 3000 + "]" * 3000, "null", "true", "[]", "{}", '""',
                     '"\\u0000"']),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.text(max_size=20).map(lambda t: json.dumps(t, ensure_ascii=False)),
)
FIELDS = st.sampled_from(["type", "context", "text", "voice", "format", "sample_rate",
                          "frame_ms", "audio_ms", "extra"])
KINDS = st.sampled_from(["start", "text", "flush", "end", "cancel", "played"])


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = Session(SessionLimits(max_text_chars=MAX_CHARS, max_contexts=MAX_CONTEXTS),
                         voices=[VOICE, "piper:b"], default_voice=VOICE)
        self.model: dict[str, dict[str, object]] = {}  # name -> {state, chars, stream}
        self.finished: dict[str, int] = {}

    def feed(self, raw: str) -> list[object]:
        actions = list(self.s.receive_text(raw))
        for action in actions:
            assert not isinstance(action, CloseConnection), action
            if isinstance(action, Reply):
                text = encode_server_message(action.message)
                text.encode("utf-8")
                json.loads(text)
                if isinstance(action.message, ErrorMessage):
                    assert action.message.code in CODES
        return actions

    @staticmethod
    def is_error(actions: list[object], code: str | None = None) -> bool:
        return (len(actions) == 1 and isinstance(actions[0], Reply)
                and isinstance(actions[0].message, ErrorMessage)
                and (code is None or actions[0].message.code == code))

    @rule(name=NAMES, voice=st.sampled_from([None, "piper:a", "piper:b", "nobody"]))
    def start(self, name: str, voice: str | None) -> None:
        body: dict[str, object] = {"type": "start", "context": name}
        if voice is not None:
            body["voice"] = voice
        actions = self.feed(json.dumps(body))
        if name in self.model:
            assert self.is_error(actions, "duplicate_context")
        elif len(self.model) >= MAX_CONTEXTS:
            assert self.is_error(actions, "too_many_contexts")
        elif voice == "nobody":
            assert self.is_error(actions, "unknown_voice")
        else:
            [action] = actions
            assert isinstance(action, OpenContext)
            self.model[name] = {"state": "open", "chars": 0, "stream": action.stream}
            self.finished.pop(name, None)

    @rule(name=NAMES, text=st.text(max_size=30))
    def text(self, name: str, text: str) -> None:
        actions = self.feed(json.dumps({"type": "text", "context": name, "text": text}))
        entry = self.model.get(name)
        if entry is None:
            assert self.is_error(actions, "unknown_context")
        elif entry["state"] == "cancelling":
            assert actions == []
        elif entry["state"] == "ending":
            assert self.is_error(actions, "bad_message")
        elif int(entry["chars"]) + len(text) > MAX_CHARS:  # type: ignore[call-overload]
            assert self.is_error(actions, "text_too_long")
        else:
            entry["chars"] = int(entry["chars"]) + len(text)  # type: ignore[call-overload]
            assert actions == ([FeedText(name, text)] if text else [])

    @rule(name=NAMES, kind=st.sampled_from(["flush", "end"]))
    def flush_or_end(self, name: str, kind: str) -> None:
        actions = self.feed(json.dumps({"type": kind, "context": name}))
        entry = self.model.get(name)
        if entry is None:
            assert self.is_error(actions, "unknown_context")
        elif entry["state"] == "cancelling":
            assert actions == []
        elif entry["state"] == "ending":
            assert self.is_error(actions, "bad_message")
        elif kind == "flush":
            assert actions == [FlushContext(name)]
        else:
            assert actions == [EndContext(name)]
            entry["state"] = "ending"

    @rule(name=NAMES)
    def cancel(self, name: str) -> None:
        actions = self.feed(json.dumps({"type": "cancel", "context": name}))
        entry = self.model.get(name)
        if entry is None:
            if name in self.finished:
                assert actions == [Reply(Cancelled(context=name, last_seq=self.finished[name]))]
            else:
                assert self.is_error(actions, "unknown_context")
        elif entry["state"] == "cancelling":
            assert actions == []
        else:
            assert actions == [CancelContext(name)]
            entry["state"] = "cancelling"

    @rule(name=NAMES, ms=st.floats(min_value=0, max_value=1e6))
    def played(self, name: str, ms: float) -> None:
        actions = self.feed(json.dumps({"type": "played", "context": name, "audio_ms": ms}))
        if name in self.model:
            assert actions == [ListenerProgress(name, ms)]
        elif name in self.finished:  # reported: a listener plays on after the end
            assert actions == [ListenerProgress(name, ms)]
        else:
            assert self.is_error(actions, "unknown_context")

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), last_seq=st.integers(-1, 1000))
    def shell_finishes(self, data: st.DataObject, last_seq: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.model)))
        self.s.context_finished(name, last_seq)
        del self.model[name]
        self.finished[name] = last_seq

    @rule(kind=KINDS, name=NAMES, field=FIELDS, raw=RAW_VALUES)
    def hostile(self, kind: str, name: str, field: str, raw: str) -> None:
        """One field replaced by a hostile or wrongly typed value: a bad message
        is answered by one error and changes nothing."""
        body = {"type": kind, "context": name, field: "__X__"}
        text = json.dumps(body).replace('"__X__"', raw)
        before = (dict(self.s._contexts), list(self.s.open_contexts))
        actions = self.feed(text)
        if len(actions) == 1 and isinstance(actions[0], Reply) \
                and isinstance(actions[0].message, ErrorMessage):
            assert (dict(self.s._contexts), list(self.s.open_contexts)) == before
        else:  # it was valid after all: keep the model in step
            for action in actions:  # (the hostile value may be the context's name)
                if isinstance(action, OpenContext):
                    opened = action.start.context
                    self.model[opened] = {"state": "open", "chars": 0,
                                          "stream": action.stream}
                    self.finished.pop(opened, None)
                elif isinstance(action, EndContext):
                    self.model[action.context]["state"] = "ending"
                elif isinstance(action, CancelContext):
                    self.model[action.context]["state"] = "cancelling"
                elif isinstance(action, FeedText):
                    entry = self.model[action.context]
                    entry["chars"] = int(entry["chars"]) + len(action.text)  # type: ignore[call-overload]

    @rule(data=st.binary(max_size=64))
    def garbage(self, data: bytes) -> None:
        actions = self.feed(data.decode("utf-8", "replace"))
        assert self.is_error(actions)  # 64 random bytes are never a valid message
        assert self.is_error(self.s.receive_binary(data), "bad_message")

    @invariant()
    def matches_model(self) -> None:
        assert sorted(self.s.open_contexts) == sorted(self.model)
        streams = [self.s.stream_of(n) for n in self.model]
        assert len(set(streams)) == len(streams)
        assert streams == [self.model[n]["stream"] for n in self.model]


SessionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSessionFuzz = SessionMachine.TestCase


def test_hostile_start_whose_context_is_a_valid_name_opens_that_name() -> None:
    """Hypothesis' counterexample: a "hostile" start whose context is the raw
    JSON string "0" is a valid start (1-64 characters) and opens context "0",
    not the name the rule drew; the model follows it and the session agrees."""
    machine = SessionMachine()
    machine.start(name="a", voice=None)
    machine.hostile(kind="start", name="a", field="context", raw='"0"')
    machine.matches_model()
    assert sorted(machine.s.open_contexts) == ["0", "a"]
    machine.hostile(kind="text", name="a", field="context", raw='"0"')  # no text: nothing
    machine.flush_or_end(name="a", kind="end")
    machine.hostile(kind="cancel", name="b", field="context", raw='"0"')
    machine.matches_model()
    assert machine.model["0"]["state"] == "cancelling"
    assert machine.model["a"]["state"] == "ending"
    machine.hostile(kind="start", name="b", field="context", raw="0")  # a number: refused
    machine.matches_model()
    assert sorted(machine.s.open_contexts) == ["0", "a"]
    machine.teardown()
