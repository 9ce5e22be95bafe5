"""What test_vllm_orpheus checks of the Orpheus voice on real vLLM (CPU wheel,
tiny Llama with dummy weights, tiny random SNAC): audio of exactly frames x
2048 samples at 24 kHz for the tokens the engine generated, cancel and close
free the vLLM request at once, two segments are generated together, and the
warm-up runs a batch. Each check is a coroutine on the voice's own event loop:
test_vllm_orpheus runs them on a voice of its own with vLLM's EngineCore in
its process, test_vllm_server on its server's voice, whose EngineCore is in a
process of its own (vLLM's default: that process takes ~15 s of a suite run
to start and ~4 s to close on 2 cores, paid once for both).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from rtserver.engine.vllm_engine import VllmEngine
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.voice import OrpheusVoice

# Dummy weights never end speech, so a segment runs to its token budget: 12 frames
# (85 tokens, ~1 s of audio) keep each test's generation short on 2 cores
# (~25-45 ms a step) and still several chunks long (the first chunk is one frame,
# and they grow: 1, 2, 4, 5).
BUDGET = ot.TokenBudget(max_frames=12)
LONG_TEXT = ("This sentence is long enough that its token budget runs to thousands of "
             "tokens, far more than the test lets it generate before it cancels. ") * 3


def engine_of(voice: OrpheusVoice) -> VllmEngine:
    engine = voice.runtime.engine
    assert isinstance(engine, VllmEngine)
    return engine


async def segment_audio_matches_generated_frames(voice: OrpheusVoice) -> None:
    engine = engine_of(voice)
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


async def first_chunk_then_stop(voice: OrpheusVoice, request_id: str, how: str) -> None:
    engine = engine_of(voice)
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


async def two_segments_at_once(voice: OrpheusVoice) -> None:
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
    assert engine_of(voice).stats().in_flight == 0


async def warm_up_runs_a_batch_of_requests_at_once(
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
    engine = engine_of(voice)
    before = engine.stats().requests_total
    await voice.warm_up()
    assert voice.runtime.config.max_num_seqs == 8
    assert peak == 8
    assert engine.stats().requests_total - before == 1 + 8
    assert engine.stats().in_flight == 0
