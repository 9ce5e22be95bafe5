"""GuardedVoice reports each synthesis to the circuit breakers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

from rtserver.audio.pcm import PcmChunk
from rtserver.config import AdmissionConfig
from rtserver.errors import Busy, EngineDead, EngineLost, EngineUnavailable
from rtserver.server.gate import Gate
from rtserver.server.guarded import GuardedVoice, unwrap
from rtserver.voices.base import SynthesisRequest, VoiceInfo

CHUNK = PcmChunk(np.zeros(100, dtype=np.float32), 16000)


class Scripted:
    """Yields ``chunks`` chunks, then raises ``fail`` (if any)."""

    def __init__(self, chunks: int, fail: BaseException | None = None) -> None:
        self.chunks = chunks
        self.fail = fail
        self.closed = 0
        self.info = VoiceInfo(name="v:x", family="test", sample_rate=16000)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[PcmChunk]:
        try:
            for _ in range(self.chunks):
                await asyncio.sleep(0)
                yield CHUNK
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed += 1


def setup(inner: Scripted) -> tuple[Gate, GuardedVoice, list[str]]:
    gate = Gate(AdmissionConfig(breaker_failures=2), ["v:x"])
    dead: list[str] = []
    return gate, GuardedVoice(inner, gate, lambda: 0.0,  # type: ignore[arg-type]
                              on_dead=lambda name, exc: dead.append(name)), dead


async def drain(voice: GuardedVoice) -> int:
    return len([c async for c in voice.synthesize(SynthesisRequest("hi", "r"))])


async def test_failures_open_the_breaker_and_a_success_resets_it() -> None:
    inner = Scripted(1, RuntimeError("boom"))
    gate, voice, _ = setup(inner)
    with pytest.raises(RuntimeError):
        await drain(voice)
    inner.fail = None
    assert await drain(voice) == 1  # success: the count starts again
    inner.fail = RuntimeError("boom")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await drain(voice)
    with pytest.raises(EngineUnavailable):
        gate.start("k", "v:x", 1.0, "c", lambda: 0.0)


async def test_a_dead_engine_is_reported_once() -> None:
    inner = Scripted(2, EngineDead("gone"))
    gate, voice, dead = setup(inner)
    for _ in range(3):
        with pytest.raises(EngineDead):
            await drain(voice)
    assert dead == ["v:x"] and gate.engine_dead and not gate.ready(0.0)[0]


async def test_stopping_early_closes_the_inner_voice() -> None:
    inner = Scripted(100)
    gate, voice, _ = setup(inner)
    async with contextlib.aclosing(voice.synthesize(SynthesisRequest("hi", "r"))) as it:
        async for _ in it:
            break
    assert inner.closed == 1
    assert gate.engine_up("v:x", 0.0)


def test_unwrap_reaches_the_loaded_voice() -> None:
    inner = Scripted(0)
    _, voice, _ = setup(inner)
    assert voice.inner is inner
    assert unwrap(voice) is inner  # type: ignore[arg-type]
    assert unwrap(inner) is inner  # type: ignore[arg-type]


@pytest.mark.parametrize("err", [EngineLost("worker gone"), Busy("worker full")])
async def test_a_lost_or_full_gpu_worker_does_not_open_the_breaker(err: Exception) -> None:
    """Those are not the voice's failures: the breaker stays closed."""
    gate, voice, dead = setup(Scripted(1, err))
    for _ in range(3):
        with pytest.raises(type(err)):
            await drain(voice)
    gate.start("k", "v:x", 0.0, "c", lambda: 0.0)  # still admitted
    assert gate.ready(0.0) == (True, "ready") and not dead


class Health:
    def __init__(self) -> None:
        self.why: str | None = None

    def admit(self, context: str) -> None:
        if self.why is not None:
            raise EngineUnavailable(self.why, context=context, retry_after_ms=1000)

    def down(self) -> str | None:
        return self.why


def test_a_voice_health_decides_ready_and_admission() -> None:
    """A voice behind a GPU worker: /ready and new contexts follow its health."""
    gate = Gate(AdmissionConfig(), ["v:x"])
    health = gate.health["v:x"] = Health()
    assert gate.ready(0.0) == (True, "ready") and gate.engine_up("v:x", 0.0)
    health.why = "GPU worker down"
    ready, why = gate.ready(0.0)
    assert not ready and "GPU worker down" in why and not gate.engine_up("v:x", 0.0)
    with pytest.raises(EngineUnavailable) as exc:
        gate.start("k", "v:x", 0.0, "c", lambda: 0.0)
    assert exc.value.retry_after_ms == 1000
    health.why = None
    gate.start("k", "v:x", 0.0, "c", lambda: 0.0)
