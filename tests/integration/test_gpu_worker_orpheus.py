"""Orpheus through a GPU worker process: ``rtserver worker`` runs the vLLM
client (its EngineCore is vLLM's own process) and the SNAC vocoder for a tiny
Llama with dummy weights on the CPU wheel; a front end in this process reaches
it over ZMQ and serves it on the WebSocket. Lean tests: vLLM takes about a
minute to start on 2 cores. The worker also serves a LoRA voice from its
``[orpheus] adapters``: the worker resolves the voice name a request carries
to its adapter, so the front end needs to know nothing of LoRA."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
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
from rtserver.voices.orpheus.layout import write_tiny_orpheus

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SNAC_FRAME = 2048  # samples of one 7-token frame at 24 kHz
KEY = "worker-test-key"


# inproc: vLLM's EngineCore in the worker's process, so two processes fewer to start
# on the CPU (its mp executor adds a worker process): ~11 s against ~25 s on
# 2 cores. test_vllm_orpheus runs both modes; test_vllm_server the separate one.
@pytest.fixture(scope="module")
def front_end(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = Path(tmp_path_factory.mktemp("orpheus"))
    model = write_tiny_orpheus(root / "llama", shape="tiny")
    snac = write_tiny_snac(root / "snac", seed=0)
    alice = write_lora_adapter(root / "alice", shape="tiny", rank=8, seed=1)
    endpoint = f"ipc://{root}/worker.sock"
    cfg = root / "worker.toml"
    cfg.write_text('[voice]\ndefault = "orpheus:tara"\n'
                   f'[orpheus]\nmodel_dir = "{model}"\nsnac_dir = "{snac}"\n'
                   'dummy_weights = true\ndevice = "cpu"\nenforce_eager = true\n'
                   'max_model_len = 2048\nmax_num_seqs = 8\nengine_process = "inproc"\n'
                   # dummy weights never end speech: each reply runs to its token budget,
                   # 8 frames (56 tokens, ~0.7 s of audio; still several chunks, the
                   # first segment's being at most 6 frames): 24 took ~8 s more of the
                   # module's three replies on 2 cores
                   'budget.max_frames = 8\n'
                   f'adapters = ["alice@tara={alice}"]\nmax_loras = 2\nmax_lora_rank = 8\n'
                   f'[gpu]\nendpoint = "{endpoint}"\n')
    log = (root / "worker.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "rtserver", "worker", "--config", str(cfg)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    srv = ServerThread.with_settings(voice={"default": "orpheus:tara"},
                                     gpu={"endpoint": endpoint}, server={"api_keys": [KEY]})
    try:
        try:
            srv.start(timeout=400)  # the front end is ready once the worker is
        except (TimeoutError, RuntimeError):
            raise AssertionError((root / "worker.log").read_text()) from None
        yield srv
    finally:
        srv.stop()
        worker.terminate()
        worker.wait(60)
        log.close()


async def test_orpheus_speaks_through_the_worker(front_end: ServerThread) -> None:
    async with RtClient.connect(front_end.url, token=KEY) as client:
        assert next(getattr(v, "name", v) for v in client.ready.voices) == "orpheus:tara"
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("Hello there.")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.pcm is not None
    pcm = result.pcm
    # whole SNAC frames of audio (the last 20 ms frame filled up with silence)
    spoken = len(np.trim_zeros(pcm, "b"))
    assert len(pcm) >= SNAC_FRAME and len(pcm) % 480 == 0
    assert len(pcm) - spoken < SNAC_FRAME + 480
    assert float(np.abs(pcm).max()) > 0
    # the model's own output time came back with the first chunk: TTFA's parts
    body = await _metrics(front_end)
    assert ('rtserver_first_audio_stage_seconds_count{stage="model",voice="orpheus:tara"} 1.0'
            in body)


async def test_a_lora_voice_speaks_through_the_worker(front_end: ServerThread) -> None:
    """orpheus:alice (an adapter in the worker's config) is listed with its
    capabilities and speaks; the front end only forwards its name."""
    async with RtClient.connect(front_end.url, token=KEY) as client:
        info = client.ready.voice_info["orpheus:alice"]
        assert info.capabilities.lora is True and info.family == "orpheus"
        assert client.ready.voice_info["orpheus:tara"].capabilities.lora is False
        ctx = await client.start(voice="orpheus:alice", format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("Hello there.")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.started is not None and result.started.voice == "orpheus:alice"
    assert result.pcm is not None and len(result.pcm) >= SNAC_FRAME
    assert float(np.abs(result.pcm).max()) > 0


async def test_a_voice_made_at_run_time_is_made_by_the_worker(
        front_end: ServerThread, tmp_path: Path) -> None:
    """POST /v1/admin/voices on a front end asks the worker, which loads the
    adapter; the voice speaks; DELETE drops it there and here."""
    carol = write_lora_adapter(tmp_path / "carol", shape="tiny", rank=8, seed=4)
    status, body = await asyncio.to_thread(_admin, front_end, "POST", {
        "name": "carol", "adapter": str(carol), "speaker": "tara"})
    assert status == 201, body
    status, body = await asyncio.to_thread(_admin, front_end, "POST", {
        "name": "dave", "adapter": str(tmp_path / "none")})
    assert status == 400 and body["code"] == "unknown_voice"
    assert "does not exist" in str(body["message"])  # the worker's reason
    async with RtClient.connect(front_end.url, token=KEY) as client:
        assert client.ready.voice_info["orpheus:carol"].capabilities.lora is True
        ctx = await client.start(voice="orpheus:carol", format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("Hello there.")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.pcm is not None and len(result.pcm) >= SNAC_FRAME
    status, body = await asyncio.to_thread(_admin, front_end, "DELETE", None,
                                           "?name=orpheus:carol")
    assert (status, body) == (200, {"removed": "orpheus:carol"})
    async with RtClient.connect(front_end.url, token=KEY) as client:
        assert "orpheus:carol" not in client.ready.voices
        with pytest.raises(ServerError) as err:
            await client.start(voice="orpheus:carol")
    assert err.value.error.code == "unknown_voice"


def _admin(srv: ServerThread, method: str, body: dict[str, str] | None,
           query: str = "") -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"{srv.http}/v1/admin/voices{query}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": f"Bearer {KEY}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def _metrics(srv: ServerThread) -> str:
    def get() -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(srv.http + "/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    return await asyncio.to_thread(get)
