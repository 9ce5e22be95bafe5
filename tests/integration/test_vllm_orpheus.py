"""Orpheus on real vLLM (CPU wheel): tiny Llama with dummy weights, tiny random SNAC.

One engine at a time (each takes ~30 s to start on 2 cores): EngineCore in
its own process, then in this one. Checks what a
user of the voice sees: audio of exactly frames x 2048 samples at 24 kHz for
the tokens the engine generated, cancel and close free the vLLM request at
once, and two segments are generated together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("vllm")

from rtserver.engine.vllm_engine import VllmEngine
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import OrpheusConfig, OrpheusVoice, load_orpheus_voice

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

# Dummy weights never end speech, so a segment runs to its token budget: 24 frames
# (169 tokens, ~2 s of audio) keep each test's generation short on 2 cores
# (~25 ms a step) and still several chunks long.
BUDGET = ot.TokenBudget(max_frames=24)
LONG_TEXT = ("This sentence is long enough that its token budget runs to thousands of "
             "tokens, far more than the test lets it generate before it cancels. ") * 3


@pytest_asyncio.fixture(scope="module", loop_scope="module",
                        params=["separate", "inproc"])
async def voice(tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> AsyncIterator[OrpheusVoice]:
    """The voice with vLLM's EngineCore in its own process (AsyncLLM), then in
    this one (engine/vllm_inproc.py): every test runs against both."""
    root = Path(tmp_path_factory.mktemp("orpheus"))
    model = write_tiny_orpheus(root / "llama", shape="tiny")
    snac = write_tiny_snac(root / "snac", seed=0)
    cfg = OrpheusConfig(model_dir=str(model), snac_dir=str(snac), dummy_weights=True,
                        device="cpu", enforce_eager=True, max_model_len=2048, max_num_seqs=8,
                        engine_process=request.param, budget=BUDGET)
    v = await load_orpheus_voice(cfg, "tara")
    await v.warm_up()
    yield v
    await v.close()


def _engine(voice: OrpheusVoice) -> VllmEngine:
    engine = voice.runtime.engine
    assert isinstance(engine, VllmEngine)
    return engine


async def test_segment_audio_matches_generated_frames(voice: OrpheusVoice) -> None:
    engine = _engine(voice)
    req = SynthesisRequest(text="Hello there.", request_id="len-1", first=True)
    budget = voice.token_request(req).max_tokens
    before = engine.stats().generation_tokens_total
    chunks = [c async for c in voice.synthesize(req)]
    generated = engine.stats().generation_tokens_total - before
    frames = generated // ot.FRAME_TOKENS  # an end token or a cut-off frame adds < 7
    assert 0 < generated <= budget
    assert frames > 0
    assert all(c.sample_rate == 24_000 for c in chunks)
    audio = np.concatenate([c.samples for c in chunks])
    assert audio.dtype == np.float32 and np.isfinite(audio).all()
    assert len(audio) == frames * 2048
    assert len(chunks) > 1  # streamed in pieces, not one block at the end


async def _first_chunk_then_stop(voice: OrpheusVoice, request_id: str, how: str) -> None:
    engine = _engine(voice)
    req = SynthesisRequest(text=LONG_TEXT, request_id=request_id)
    budget = voice.token_request(req).max_tokens
    before = engine.stats().generation_tokens_total
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in voice.synthesize(req):
            got_first.set()

    if how == "cancel":
        task = asyncio.create_task(consume())
        await got_first.wait()
        assert engine.stats().in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        gen = voice.synthesize(req)
        await anext(gen)
        assert engine.stats().in_flight == 1
        await gen.aclose()  # type: ignore[attr-defined]
    # freed at once in this process ...
    assert engine.stats().in_flight == 0
    assert engine.unfinished_requests() == 0
    # ... and in vLLM's scheduler: after one more short request the scheduler
    # reports nothing running or waiting and every KV block free.
    short = SynthesisRequest(text="Hi.", request_id=f"{request_id}-after")
    async for _ in voice.stream(short, max_tokens=ot.FRAME_TOKENS):
        pass
    s = engine.stats()
    assert (s.running, s.waiting, s.kv_cache_usage) == (0, 0, 0.0)
    assert s.generation_tokens_total - before < budget // 2  # it stopped early


async def test_cancel_frees_the_vllm_request(voice: OrpheusVoice) -> None:
    await _first_chunk_then_stop(voice, "cancel-1", "cancel")


async def test_closing_the_stream_frees_the_vllm_request(voice: OrpheusVoice) -> None:
    await _first_chunk_then_stop(voice, "close-1", "aclose")


async def test_two_segments_at_once(voice: OrpheusVoice) -> None:
    spans: dict[str, tuple[float, float, int]] = {}

    async def run(rid: str, text: str) -> None:
        first = None
        samples = 0
        async for c in voice.synthesize(SynthesisRequest(text=text, request_id=rid)):
            first = first if first is not None else time.monotonic()
            samples += len(c.samples)
        assert first is not None
        spans[rid] = (first, time.monotonic(), samples)

    await asyncio.gather(run("pair-a", "The first of two."), run("pair-b", "And the second."))
    (a0, a1, na), (b0, b1, nb) = spans["pair-a"], spans["pair-b"]
    assert na > 0 and nb > 0 and na % 2048 == 0 and nb % 2048 == 0
    assert a0 < b1 and b0 < a1  # generated together, not one after the other
    assert _engine(voice).stats().in_flight == 0


async def test_warm_up_runs_a_batch_of_requests_at_once(
        voice: OrpheusVoice, monkeypatch: pytest.MonkeyPatch) -> None:
    """One request, then ``warm_up_batches`` (8, 16) capped at max_num_seqs (8 here)
    at once: vLLM's sampler kernels for 8+ rows compile before /ready."""
    real_stream = voice.stream
    open_now = 0
    peak = 0

    async def counted(req: SynthesisRequest, *, max_tokens: int | None = None
                      ) -> AsyncIterator[object]:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        try:
            async for chunk in real_stream(req, max_tokens=max_tokens):
                yield chunk
        finally:
            open_now -= 1

    monkeypatch.setattr(voice, "stream", counted)
    engine = _engine(voice)
    before = engine.stats().requests_total
    await voice.warm_up()
    assert voice.runtime.config.max_num_seqs == 8
    assert peak == 8
    assert engine.stats().requests_total - before == 1 + 8
    assert engine.stats().in_flight == 0
