"""ChatTTS voices end to end: a real server on 127.0.0.1 with a tiny checkpoint
(random weights: the audio is noise of the right length), the real client."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pybase16384")

from rtserver.client import AudioFrames, RtClient, ServerError
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import wait_until_async
from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.chattts.speaker import encode_speaker

SAMPLES_PER_STEP = 512
BASE_S, PER_CHAR_S = 0.3, 0.02  # short segments: the tiny model runs on 2 shared cores


def steps_for(text: str) -> int:
    """The voice's step budget (``voice.step_budget``) for English text."""
    chars = sum(1 for ch in text if ch.isalnum())
    return math.ceil((BASE_S + PER_CHAR_S * chars) * 24000 / 512)


@pytest.fixture(scope="module")
def chattts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("chattts")
    write_tiny_chattts(root)
    voices = root / "voices.json"
    vec = np.random.default_rng(5).standard_normal(32).astype(np.float32)
    voices.write_text(json.dumps({"alice": encode_speaker(vec)}))
    srv = ServerThread.with_settings(
        server={"max_contexts": 4},
        voice={"default": "chattts:alice", "extra": "chattts:seed_1"},
        chattts={"asset_dir": str(root), "device": "cpu", "slots": 2,
                 "max_len": 1024,  # room for test_cancel_frees_the_slot's long segment
                 "voices_file": str(voices), "seeds": "1,3", "ignore_eos": True,
                 "budget_base_s": BASE_S, "budget_s_per_char": PER_CHAR_S,
                 "warm_up_steps": 2},
    ).start(timeout=300)
    yield srv
    srv.stop()


def assert_length(pcm: np.ndarray | None, text: str) -> None:
    """Every step of the segment's budget and nothing more: 512 samples a step,
    the last 20 ms frame filled up with silence (480 samples at 24 kHz)."""
    assert pcm is not None
    n = steps_for(text) * SAMPLES_PER_STEP
    assert len(pcm) == math.ceil(n / 480) * 480
    assert not pcm[n:].any()


def get_json(url: str) -> dict[str, list[dict[str, str]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: dict[str, list[dict[str, str]]] = json.loads(resp.read())
    return body


def _engine(server: ServerThread) -> object:
    from rtserver.server.guarded import unwrap
    from rtserver.voices.chattts.voice import ChatTTSVoice

    assert server.server is not None and server.server.app is not None
    voice = unwrap(server.server.app.voices["chattts:alice"])
    assert isinstance(voice, ChatTTSVoice)
    return voice.runtime.engine


def slots_in_use(server: ServerThread) -> int:
    engine = _engine(server)
    return int(server.call(lambda: engine.slots_in_use()))  # type: ignore[attr-defined]


def aborted_total(server: ServerThread) -> int:
    engine = _engine(server)
    return int(server.call(lambda: engine.stats().aborted_total))  # type: ignore[attr-defined]


# first in the file: the module's server (one ChatTTS engine per process) is not up yet
def test_bad_speaker_string_fails_start_with_its_reason(tmp_path: Path) -> None:
    write_tiny_chattts(tmp_path, decoder=False)
    voices = tmp_path / "voices.toml"
    voices.write_text('[speakers]\nbob = "not a speaker"\n')
    srv = ServerThread.with_settings(
        voice={"default": "chattts:bob"},
        chattts={"asset_dir": str(tmp_path), "device": "cpu", "voices_file": str(voices)})
    with pytest.raises(RuntimeError) as exc:
        srv.start(timeout=120)
    cause = exc.value.__cause__
    assert cause is not None and "bob" in str(cause), repr(cause)
    assert getattr(cause, "code", None) == "unknown_voice"
    # start() returned once the thread had ended: its loop is closed, and stop()
    # is a clean no-op (it used to post to that closed loop when the thread won)
    srv.stop()
    srv.stop()


async def test_voices_listed(chattts_server: ServerThread) -> None:
    body = await asyncio.to_thread(get_json, chattts_server.http + "/v1/voices")
    names = [v["name"] for v in body.get("voices", body)]
    assert names[0] == "chattts:alice"
    assert {"chattts:seed_1", "chattts:seed_3"} <= set(names)
    async with RtClient.connect(chattts_server.url) as client:
        listed = [getattr(v, "name", v) for v in client.ready.voices]
        assert "chattts:seed_3" in listed


async def test_audio_of_the_right_length(chattts_server: ServerThread) -> None:
    text = "Hello there."
    async with RtClient.connect(chattts_server.url) as client:
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx.send_text(text)
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert_length(result.pcm, text)
    assert result.pcm is not None and float(np.abs(result.pcm).max()) > 0
    assert slots_in_use(chattts_server) == 0


async def test_two_contexts_at_once(chattts_server: ServerThread) -> None:
    texts = {"chattts:alice": "One two three.", "chattts:seed_3": "Good morning to you."}
    async with RtClient.connect(chattts_server.url) as client:

        async def run(voice: str, text: str) -> np.ndarray:
            ctx = await client.start(voice=voice, format="pcm_s16le", sample_rate=24000)
            await ctx.send_text(text)
            await ctx.end()
            result = await ctx.collect()
            assert result.ok, (result.error, result.failure)
            assert result.pcm is not None
            return result.pcm

        pcms = await asyncio.gather(*(run(v, t) for v, t in texts.items()))
    for pcm, text in zip(pcms, texts.values(), strict=True):
        assert_length(pcm, text)


async def test_cancel_frees_the_slot(chattts_server: ServerThread) -> None:
    # Chinese: 0.6 s of budget per character (budget_s_per_cjk), so the first
    # segment (12 characters) runs ~350 steps, 1.6-2.4 s on the 2-core box after
    # its first frame: still generating when the test looks. An English one
    # of the module's budgets was done ~0.1 s after its first frame.
    async with RtClient.connect(chattts_server.url) as client:
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("今天天气很好我们一起去公园散步吧然后回家吃饭")
        await ctx.end()
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                break
        assert slots_in_use(chattts_server) == 1
        aborted = aborted_total(chattts_server)
        await ctx.cancel()
        await wait_until_async(lambda: slots_in_use(chattts_server) == 0,
                               "the cancelled context's slot is free")
        assert aborted_total(chattts_server) == aborted + 1  # by the cancel, not its end
        # the connection goes on: another context speaks
        ctx2 = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx2.send_text("Hi.")
        await ctx2.end()
        result = await ctx2.collect()
        assert result.ok
        assert_length(result.pcm, "Hi.")


async def test_unknown_speaker_is_unknown_voice(chattts_server: ServerThread) -> None:
    async with RtClient.connect(chattts_server.url) as client:
        with pytest.raises(ServerError) as exc:
            await client.start(voice="chattts:nobody")
        assert exc.value.error.code == "unknown_voice"
