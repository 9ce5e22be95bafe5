"""The whole server on the vLLM Orpheus voice (CPU wheel, tiny random model).

Over the WebSocket, like any client: a reply streamed in comes back as audio
of the length the engine generated, a cancel frees the vLLM request, two
contexts run at once, and vLLM's own stats reach /metrics. First, the voice
checks of test_vllm_orpheus (tests/integration/orpheus_checks.py) on the
server's own voice, whose EngineCore is in its own process: one EngineCore
process started for both (~15 s of a suite run on 2 cores, ~4 s to close).
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from rtserver.client import AudioFrames, RtClient
from rtserver.engine.submit_gate import SubmitGate
from rtserver.server.guarded import unwrap
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import wait_until_async
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import OrpheusVoice

from . import orpheus_checks as check

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SAMPLES_PER_FRAME = 2048  # SNAC 24 kHz: one frame of 7 Orpheus tokens


@pytest.fixture(scope="module")
def orpheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = Path(tmp_path_factory.mktemp("orpheus-server"))
    model = write_tiny_orpheus(root / "llama", shape="tiny")
    snac = write_tiny_snac(root / "snac", seed=0)
    srv = ServerThread.with_settings(
        voice={"default": "orpheus:tara", "extra": "piper"},
        orpheus={"model_dir": str(model), "snac_dir": str(snac), "dummy_weights": True,
                 "device": "cpu", "enforce_eager": True, "max_model_len": 2048,
                 "max_num_seqs": 8,
                 # dummy weights never end speech: each reply runs to its token budget,
                 # check.BUDGET's 12 frames (85 tokens, ~1 s of audio)
                 "budget.max_frames": check.BUDGET.max_frames},
    ).start(timeout=600)
    yield srv
    srv.stop()


def metric(srv: ServerThread, name: str) -> float:
    with urllib.request.urlopen(srv.http + "/metrics", timeout=10) as resp:
        body = resp.read().decode()
    values = [float(line.split()[-1]) for line in body.splitlines()
              if line.startswith(name + " ") or line.startswith(name + "{")]
    assert values, f"{name} not in /metrics"
    return sum(values)


# --- test_vllm_orpheus's voice checks, on this server's voice and its loop ---------


def served_voice(srv: ServerThread) -> OrpheusVoice:
    """orpheus:tara as the server loaded it (its settings are test_vllm_orpheus's)."""
    assert srv.server is not None and srv.server.app is not None
    voice = unwrap(srv.server.app.voices["orpheus:tara"])
    assert isinstance(voice, OrpheusVoice)
    assert voice.runtime.config.engine_process == "separate"
    assert voice.runtime.config.budget == check.BUDGET
    return voice


async def on_server(srv: ServerThread, coro: Coroutine[Any, Any, None]) -> None:
    await asyncio.wrap_future(srv.submit(coro))


async def test_voice_segment_audio_matches_generated_frames(
        orpheus_server: ServerThread) -> None:
    voice = served_voice(orpheus_server)
    await on_server(orpheus_server, check.segment_audio_matches_generated_frames(voice))


async def test_voice_cancel_frees_the_vllm_request(orpheus_server: ServerThread) -> None:
    voice = served_voice(orpheus_server)
    await on_server(orpheus_server, check.first_chunk_then_stop(voice, "cancel-1", "cancel"))


async def test_voice_closing_the_stream_frees_the_vllm_request(
        orpheus_server: ServerThread) -> None:
    voice = served_voice(orpheus_server)
    await on_server(orpheus_server, check.first_chunk_then_stop(voice, "close-1", "aclose"))


async def test_voice_two_segments_at_once(orpheus_server: ServerThread) -> None:
    voice = served_voice(orpheus_server)
    await on_server(orpheus_server, check.two_segments_at_once(voice))


async def test_voice_warm_up_runs_a_batch_of_requests_at_once(
        orpheus_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    voice = served_voice(orpheus_server)
    await on_server(orpheus_server,
                    check.warm_up_runs_a_batch_of_requests_at_once(voice, monkeypatch))


# --- the server, over the WebSocket ---------------------------------------------------


async def test_orpheus_reply_over_the_websocket(orpheus_server: ServerThread) -> None:
    async with RtClient.connect(orpheus_server.url) as client:
        assert client.ready.voices[0] == "orpheus:tara"
        assert "orpheus:leah" in client.ready.voices and "piper:en_US-joe-medium" in \
            client.ready.voices
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        for word in "Hello there, this is a test.".split(" "):
            await ctx.send_text(word + " ")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.started.voice == "orpheus:tara"
    assert result.pcm is not None
    # 24 kHz PCM: every SNAC frame is 2048 samples; the framer pads the last 20 ms frame
    frame = 24000 * 20 // 1000
    samples = len(result.pcm)
    assert samples % frame == 0
    assert samples >= SAMPLES_PER_FRAME
    assert result.done is not None and result.done.ttfa_ms is not None


async def test_cancel_frees_the_vllm_request(orpheus_server: ServerThread) -> None:
    long_text = "This reply is long enough to keep the engine busy for a while. " * 4
    async with RtClient.connect(orpheus_server.url) as client:
        ctx = await client.start()
        await ctx.send_text(long_text)
        await ctx.end()
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                break
        assert metric(orpheus_server, "rtserver_engine_in_flight_requests") >= 1
        cancelled = await ctx.cancel()
        assert cancelled.last_seq >= 0
        await wait_until_async(
            lambda: metric(orpheus_server, "rtserver_engine_in_flight_requests") == 0,
            "the vLLM request is freed")


async def test_two_orpheus_contexts_at_once(orpheus_server: ServerThread) -> None:
    async with RtClient.connect(orpheus_server.url) as client:
        a = await client.start("a", voice="orpheus:tara")
        b = await client.start("b", voice="orpheus:leo")
        await a.send_text("First speaker here.")
        await b.send_text("Second speaker here.")
        await a.end()
        await b.end()
        ra, rb = await asyncio.gather(a.collect(), b.collect())
    assert ra.ok and rb.ok
    assert ra.started.voice == "orpheus:tara" and rb.started.voice == "orpheus:leo"
    assert ra.frame_count > 0 and rb.frame_count > 0
    assert metric(orpheus_server, "rtserver_engine_requests_total") >= 2
    # vLLM's steps, and those that gave a request its first token (each request had one)
    prefill = metric(orpheus_server, "rtserver_engine_vllm_prefill_steps_total")
    assert 1 <= prefill < metric(orpheus_server, "rtserver_engine_vllm_steps_total")


async def test_a_held_later_segment_goes_to_vllm_and_speaks(
        orpheus_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """[orpheus] later_hold_ms: a context's second segment waits at the engine's
    submit gate, goes to vLLM when the hold ends, and speaks whole."""
    engine = served_voice(orpheus_server).runtime.engine
    gate = SubmitGate(hold_s=0.05)
    monkeypatch.setattr(engine, "gate", gate)
    async with RtClient.connect(orpheus_server.url) as client:
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("Hello there. ")
        await ctx.send_text("This is the second sentence.")
        await ctx.end()
        result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert gate.held >= 1 and gate.releases >= 1
    assert metric(orpheus_server, "rtserver_engine_vllm_held_requests_total") == gate.held
    # both segments spoke, the held one too: each one's audio opens with a message
    # flagged segment_start (a length is no check: random weights may sample an end
    # token at a frame boundary, and one segment of a fresh clone's run did)
    assert sum(m.segment_start for m in result.frames) == 2
    assert result.pcm is not None and len(result.pcm) >= 2 * SAMPLES_PER_FRAME


def test_the_dashboards_engine_metrics_are_served(orpheus_server: ServerThread) -> None:
    """Every vLLM metric the Grafana dashboard and the alerts query is on
    /metrics (deploy/; the rest is checked on a Piper server in tests/deploy)."""
    from tests.deploy.test_observability import engine_metrics_queried, exposed

    with urllib.request.urlopen(orpheus_server.http + "/metrics", timeout=10) as resp:
        names = exposed(resp.read().decode())
    wanted = engine_metrics_queried()
    assert wanted and not wanted - names, sorted(wanted - names)


@pytest.mark.parametrize("fault", ["oom", "error"])
async def test_a_fault_in_a_request_fails_its_context_and_vllm_goes_on(
        orpheus_server: ServerThread, fault: str) -> None:
    """A request that fails after its first output (injected into vLLM's
    ``AsyncLLM.generate`` of the running server: an out-of-memory error or
    another) fails that context with ``engine_failed``; vLLM is not dead, so
    the next context speaks, ``/ready`` stays 200 and nothing stays held."""
    import contextlib

    import torch

    from rtserver.server.guarded import unwrap
    from rtserver.tools.bench.server_proc import http_get

    assert orpheus_server.server is not None and orpheus_server.server.app is not None
    engine = unwrap(orpheus_server.server.app.voices["orpheus:tara"]).runtime.engine  # type: ignore[attr-defined]
    llm = engine._llm
    real = llm.generate
    error = (torch.OutOfMemoryError("injected: out of memory") if fault == "oom"
             else RuntimeError("injected: a step failed"))
    faults = [error]

    def failing(*args: object, **kwargs: object) -> object:
        async def outputs() -> object:
            async with contextlib.aclosing(real(*args, **kwargs)) as stream:  # aborts it
                async for out in stream:
                    yield out
                    if faults:
                        raise faults.pop()
        return outputs()

    llm.generate = failing
    try:
        async with RtClient.connect(orpheus_server.url) as client:
            failed = await client.say("Hello there.", voice="orpheus:tara")
            assert failed.error is not None and failed.error.code == "engine_failed"
            assert "injected" in failed.error.message
            assert (await client.say("Hello again.", voice="orpheus:tara")).ok
    finally:
        del llm.generate
    assert http_get(orpheus_server.http + "/ready")[0] == 200
    assert engine.dead_reason() is None
    await wait_until_async(
        lambda: metric(orpheus_server, "rtserver_engine_in_flight_requests") == 0,
        "no vLLM request is held")


async def test_zz_a_killed_engine_core_takes_the_voice_down(
        orpheus_server: ServerThread) -> None:
    """Last in the module (it kills the engine): vLLM's engine core process
    killed with no request in flight. The server's watch reads vLLM's
    ``errored``: the Orpheus voices go down for good (``/ready`` 503, a new
    context ``engine_failed``) and the server marks itself for its exit 70;
    the Piper voice of the same server still speaks until then."""
    import multiprocessing
    import os
    import signal

    from rtserver.client import ServerError
    from rtserver.testing.wait import wait_until
    from rtserver.tools.bench.server_proc import http_get

    cores = [p for p in multiprocessing.active_children() if "EngineCore" in p.name]
    assert cores, [p.name for p in multiprocessing.active_children()]
    for proc in cores:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: http_get(orpheus_server.http + "/ready")[0] == 503,
               "/ready turns 503 with nothing in flight")
    assert orpheus_server.server is not None and orpheus_server.server.app is not None
    assert orpheus_server.server.app.engine_dead.is_set()
    async with RtClient.connect(orpheus_server.url) as client:
        with pytest.raises(ServerError) as refused:
            await client.start(voice="orpheus:tara")
        assert refused.value.error.code == "engine_failed"
        piper = await client.start(voice="piper:en_US-joe-medium")
        await piper.send_text("Still here.")
        await piper.end()
        assert (await piper.collect()).ok
