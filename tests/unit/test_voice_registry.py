"""Voice families as plug-ins: a family declares its section and loader and
registers itself; config and the registry take it with no other edit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rtserver.audio.pcm import PcmChunk
from rtserver.config import load_config
from rtserver.errors import ConfigError, UnknownVoice
from rtserver.protocol.session import Session, SessionLimits
from rtserver.voices import registry
from rtserver.voices.base import SynthesisRequest, VoiceInfo
from rtserver.voices.orpheus.config import OrpheusConfig
from rtserver.voices.registry import (
    FamilyVoices,
    VoiceFamily,
    VoiceSettings,
    family_of,
    load_voices,
    register_family,
)


@dataclass(frozen=True, slots=True)
class HumConfig:
    pitch_hz: float = 220.0
    speakers: tuple[str, ...] = ("low", "high")

    def check(self) -> None:
        if self.pitch_hz <= 0:
            raise ValueError(f"pitch_hz {self.pitch_hz} must be > 0")


class HumVoice:
    def __init__(self, name: str, pitch_hz: float) -> None:
        self._info = VoiceInfo(name=f"hum:{name}", family="hum", sample_rate=8000)
        self.pitch_hz = pitch_hz
        self.closed = False

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        t = np.arange(800) / 8000
        yield PcmChunk(np.sin(2 * np.pi * self.pitch_hz * t).astype(np.float32), 8000)

    async def close(self) -> None:
        self.closed = True


async def _load_hum(specs: Sequence[str], section: object, settings: VoiceSettings,
                    progress: Callable[[str], None]) -> FamilyVoices:
    assert isinstance(section, HumConfig)
    voices = {f"hum:{s}": HumVoice(s, section.pitch_hz) for s in section.speakers}
    by_spec = {}
    for spec in specs:
        name = spec if spec.startswith("hum:") else "hum:low"
        if name not in voices:
            raise UnknownVoice(f"no hum voice {spec}")
        by_spec[spec] = name
    return FamilyVoices(voices=dict(voices), by_spec=by_spec,
                        warm_up_via=[next(iter(voices.values()))])


@pytest.fixture
def hum(monkeypatch: pytest.MonkeyPatch) -> VoiceFamily:
    registry.families()  # the built-in ones first
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    return register_family(VoiceFamily(name="hum", load=_load_hum, section=HumConfig))


def test_a_new_family_owns_its_section_in_toml_env_and_flags(hum: VoiceFamily,
                                                             tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[voice]\ndefault = "hum:high"\n[hum]\npitch_hz = 300\n')
    config = load_config(toml, env={})
    assert config.family("hum", HumConfig).pitch_hz == 300.0
    config = load_config(toml, env={"RTSERVER_HUM_PITCH_HZ": "400"},
                         flags={"hum.speakers": "a,b"})
    section = config.family("hum", HumConfig)
    assert section.pitch_hz == 400.0 and section.speakers == ("a", "b")
    assert isinstance(config.families["orpheus"], OrpheusConfig)  # built-ins stay


def test_a_section_is_checked_once_every_source_is_applied(hum: VoiceFamily) -> None:
    with pytest.raises(ConfigError, match=r"\[hum\] pitch_hz -1.0 must be > 0"):
        load_config(env={"RTSERVER_HUM_PITCH_HZ": "-1"})
    with pytest.raises(ConfigError, match=r"environment RTSERVER_\* \[hum\] pitch_hz: 'x' is "
                       r"not a float"):
        load_config(env={"RTSERVER_HUM_PITCH_HZ": "x"})
    with pytest.raises(ConfigError, match=r"\[orpheus\] speaker 'nobody' is not one of"):
        load_config(env={"RTSERVER_ORPHEUS_SPEAKER": "nobody"})
    with pytest.raises(ConfigError, match=r"\[orpheus\]: unknown setting 'nope'"):
        load_config(flags={"orpheus.nope": 1})
    # the speaker may name one of the speakers another source sets
    cfg = load_config(env={"RTSERVER_ORPHEUS_SPEAKER": "a"}, flags={"orpheus.speakers": "a,b"})
    assert cfg.family("orpheus", OrpheusConfig).speaker == "a"


async def test_voices_load_through_their_family_default_first(hum: VoiceFamily) -> None:
    config = load_config(env={}, flags={"voice.default": "hum:high", "voice.extra": "hum:low"})
    vs = await load_voices(config.voice, config.families, progress=lambda m: None)
    try:
        assert list(vs.voices) == ["hum:high", "hum:low"] and vs.default == "hum:high"
        assert len(vs.warm_up_via) == 1
    finally:
        await vs.close()
    assert all(v.closed for v in vs.voices.values() if isinstance(v, HumVoice))


def test_an_unknown_prefix_is_unknown_voice_listing_the_families() -> None:
    with pytest.raises(UnknownVoice, match="no voice family 'nosuch'; the families are "
                                           "chattts, orpheus, piper"):
        family_of("nosuch:x")
    assert family_of("orpheus:tara").name == "orpheus"
    assert family_of("piper").name == "piper" and family_of("voices/x.onnx").name == "piper"
    session = Session(SessionLimits(max_text_chars=100, max_contexts=2), voices=["piper:a"],
                      default_voice="piper:a", families=("piper", "orpheus"))
    [reply] = session.receive_text('{"type": "start", "context": "c", "voice": "nope:x"}')
    message = reply.message  # type: ignore[attr-defined]
    assert message.code == "unknown_voice" and "piper, orpheus" in message.message


def test_family_names_split_env_variables() -> None:
    with pytest.raises(ValueError, match="lowercase letters and digits"):
        register_family(VoiceFamily(name="my_family", load=_load_hum))
