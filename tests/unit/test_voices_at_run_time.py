"""Voices added and removed while the server runs (LoRA voices): a connection
already open sees them, `ready` describes them, and a removed one is
`unknown_voice` again; the default voice is never removed by a worker's news."""

from __future__ import annotations

import json

from rtserver.clock import ManualClock
from rtserver.config import Config
from rtserver.protocol.messages import ErrorMessage
from rtserver.protocol.session import OpenContext, Reply, Session, SessionLimits
from rtserver.server.state import AppState
from rtserver.voices.base import VoiceInfo
from tests.unit.test_core_guarantees import FakeVoice


def _start(session: Session, context: str, voice: str) -> object:
    (action,) = session.receive_text(json.dumps({"type": "start", "context": context,
                                                 "voice": voice}))
    return action


def test_a_voice_added_later_is_served_on_an_open_connection_then_removed() -> None:
    clock = ManualClock()
    base = FakeVoice(clock)
    app = AppState(config=Config(), voices={"fake:v": base},  # type: ignore[dict-item]
                   default_voice="fake:v", clock=clock)
    session = Session(SessionLimits(max_text_chars=100, max_contexts=4),
                      voices=app.voices.keys(), default_voice=app.default_voice,
                      voice_aliases=app.voice_aliases, families=("fake",))
    added = FakeVoice(clock, info=VoiceInfo(name="fake:w", family="fake", sample_rate=24000))
    app.add_voice(added)  # type: ignore[arg-type]
    opened = _start(session, "c1", "w")  # the short name works too
    assert isinstance(opened, OpenContext) and opened.voice == "fake:w"
    assert app.ready_message().voice_info["fake:w"].sample_rate == 24000
    assert "fake:w" in app.gate.breakers and "fake:w" in app.core.voices
    app.remove_voice("fake:w")
    refused = _start(session, "c2", "fake:w")
    assert isinstance(refused, Reply) and isinstance(refused.message, ErrorMessage)
    assert refused.message.code == "unknown_voice"
    assert "fake:w" not in app.gate.breakers and "w" not in app.voice_aliases
    app.apply_voice_changes({}, ["fake:v"])  # a worker's list without the default
    assert "fake:v" in app.voices
