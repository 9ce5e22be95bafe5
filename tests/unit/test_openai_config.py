"""The `[openai]` section: OpenAI's voice names map to configured voices."""

from __future__ import annotations

import pytest

from rtserver.config import OPENAI_VOICES, load_config
from rtserver.errors import ConfigError


def test_every_openai_voice_name_maps_to_the_default_voice_by_default() -> None:
    config = load_config(env={})
    assert config.openai.voice_map() == dict.fromkeys(OPENAI_VOICES, "default")
    assert len(OPENAI_VOICES) == 13 and config.openai.ignore_instructions is False


def test_pairs_from_the_environment_override_and_add_names() -> None:
    config = load_config(env={"RTSERVER_OPENAI_VOICES": "nova=chattts:2, voice_9 = piper:x",
                              "RTSERVER_OPENAI_IGNORE_INSTRUCTIONS": "true"})
    voices = config.openai.voice_map()
    assert voices["nova"] == "chattts:2" and voices["voice_9"] == "piper:x"
    assert voices["alloy"] == "default" and config.openai.ignore_instructions


@pytest.mark.parametrize("pair", ["alloy", "=piper:x", "alloy="])
def test_a_pair_that_is_not_name_equals_voice_is_refused(pair: str) -> None:
    with pytest.raises(ConfigError, match=r"openai\.voices"):
        load_config(env={}, flags={"openai.voices": pair})


def test_cors_origins_are_off_by_default() -> None:
    assert load_config(env={}).server.cors_origins == ()
    config = load_config(env={"RTSERVER_SERVER_CORS_ORIGINS": "https://a.example,*"})
    assert config.server.cors_origins == ("https://a.example", "*")
