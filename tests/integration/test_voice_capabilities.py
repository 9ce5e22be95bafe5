"""What a voice can do, before using it: `ready.voice_info` and `GET /v1/voices`
say the same, and say what the embedded Piper voice offers today."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import msgspec
import pytest

from rtserver.client import RtClient
from rtserver.testing.server_thread import ServerThread

VOICE = "piper:en_US-joe-medium"


def get_voices(server: ServerThread) -> dict[str, list[dict[str, object]]]:
    with urllib.request.urlopen(server.http + "/v1/voices", timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


async def test_ready_and_voices_endpoint_describe_each_voice_alike(server: ServerThread) -> None:
    async with RtClient.connect(server.url) as client:
        info = client.ready.voice_info
    assert set(info) == set(client.ready.voices)
    joe = info[VOICE]
    assert joe.family == "piper" and joe.sample_rate == 22050
    assert joe.languages == ("en_US",)
    caps = joe.capabilities
    assert caps.word_timing == "model"  # its duration predictor times the words (VoiceInfo)
    assert caps.lexicon == ("alias", "phoneme") and caps.phoneme_alphabet == "ipa"
    assert caps.ssml == ("speak", "break", "sub", "phoneme", "prosody")
    assert caps.control_tokens == ()
    assert caps.speed is True and caps.speed_range == (0.5, 2.0) and caps.lora is False
    listed = {v["name"]: v for v in (await asyncio.to_thread(get_voices, server))["voices"]}
    entry = listed[VOICE]
    as_json = json.loads(msgspec.json.encode(joe))
    for field in ("family", "languages", "sample_rate", "capabilities"):
        assert entry[field] == as_json[field], field
    assert entry["default"] is True and entry["language"] == "en_US"


def test_admin_voices_endpoint_is_off_without_api_keys(server: ServerThread) -> None:
    """A server without API keys cannot be made to read adapter folders."""
    req = urllib.request.Request(server.http + "/v1/admin/voices", method="POST",
                                 data=b'{"name": "x", "adapter": "/"}')
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404
    assert json.loads(err.value.read())["message"].startswith("no API keys are configured")
