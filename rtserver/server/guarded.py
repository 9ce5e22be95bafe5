"""A voice seen through its circuit breaker: the server wraps every loaded
voice in ``GuardedVoice`` so that each synthesis reports to the ``Gate``:
a synthesis that ends is a success, an exception a failure (``EngineDead``: the engine is
gone for good, and ``on_dead`` is called once; ``EngineLost``: the GPU worker
process went away, which the voice's own health reports, so not counted;
nor are ``Busy`` and ``Overloaded``: a full GPU worker, a slow consumer).
The core never knows."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable

from rtserver.audio.pcm import PcmChunk
from rtserver.errors import Busy, EngineDead, EngineLost, Overloaded
from rtserver.server.gate import Gate
from rtserver.voices.base import SynthesisRequest, Voice, VoiceInfo

log = logging.getLogger("rtserver.server")


class GuardedVoice:
    """``voice`` with its outcomes reported to ``gate`` (the Voice protocol).

    ``inner`` is the wrapped voice itself (for tools and tests that need the
    concrete voice; see ``unwrap``)."""

    def __init__(self, voice: Voice, gate: Gate, clock: Callable[[], float],
                 on_dead: Callable[[str, BaseException], None] | None = None) -> None:
        self.inner = voice
        self._gate = gate
        self._clock = clock
        self._on_dead = on_dead

    @property
    def info(self) -> VoiceInfo:
        return self.inner.info

    async def warm_up(self) -> None:
        await self.inner.warm_up()

    async def close(self) -> None:
        await self.inner.close()

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        """The inner voice's chunks; a synthesis that ends is a success, one
        that raises a failure; one stopped by its consumer is neither."""
        name = self.inner.info.name
        chunks = self.inner.synthesize(request)
        try:
            async for chunk in chunks:
                yield chunk
        except (EngineLost, Busy, Overloaded):
            # not the voice's fault: its GPU worker went away (its health says
            # so), is at capacity, or the consumer fell behind
            raise
        except EngineDead as exc:
            log.error("voice %s: its engine is dead: %s", name, exc)
            first = not self._gate.engine_dead
            self._gate.voice_failed(name, self._clock(), str(exc), dead=True)
            if first and self._on_dead is not None:
                self._on_dead(name, exc)
            raise
        except Exception as exc:  # the voice's fault; the core reports it
            self._gate.voice_failed(name, self._clock(), f"{type(exc).__name__}: {exc}")
            raise
        else:
            self._gate.voice_succeeded(name, self._clock())
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:  # stopped early: stop the voice now, not at GC
                await aclose()


def unwrap(voice: Voice) -> Voice:
    """The voice under any ``GuardedVoice`` wrappers (``voice`` itself if none)."""
    while isinstance(voice, GuardedVoice):
        voice = voice.inner
    return voice


__all__ = ["GuardedVoice", "unwrap"]
