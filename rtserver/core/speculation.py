"""A context's first segment spoken before its cut is confirmed.

The segmenter cuts the first segment only when the word that completes it is
known to be complete, which is when the next fragment's white space arrives
(one LLM token later, ~25 ms at 40 tokens/s). ``Segmenter.tentative`` names
the segment that white space would cut; a ``Speculation`` starts synthesizing
it at once and holds its audio. When the cut comes, the speaker compares: the
same segment adopts the synthesis (its audio so far, then the rest as it
comes), so time to first audio is the longer of the wait and the synthesis
instead of their sum; any other segment drops it (the voice's request is
closed, which frees an engine's row within a step) and nothing of it is heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator

from rtserver.audio.pcm import PcmChunk
from rtserver.text.segmenter import Segment
from rtserver.voices.base import Marks, SynthesisRequest, Voice

log = logging.getLogger("rtserver.context")


class Speculation:
    """The synthesis of ``segment`` (as the segmenter would cut it), running
    ahead on its own task; ``chunks`` hands its audio to the adopter, ``drop``
    stops it. Its audio is at most one first segment's (its text is bounded
    by the first segment's word limit and ``max_chars``)."""

    def __init__(self, segment: Segment, request: SynthesisRequest, marks: Marks,
                 voice: Voice, began: float) -> None:
        self.segment = segment
        self.request = request
        self.marks = marks  # the voice's marks for this synthesis (its first audio)
        self.began = began
        self.first_chunk_at: float | None = None  # when the voice made its first chunk
        self._held: deque[PcmChunk] = deque()
        self._more = asyncio.Event()
        self._ended = False
        self._error: Exception | None = None
        self._task = asyncio.create_task(self._pump(voice), name=f"speculate {request.request_id}")

    async def _pump(self, voice: Voice) -> None:
        try:
            async with contextlib.aclosing(voice.synthesize(self.request)) as chunks:
                async for chunk in chunks:
                    if self.first_chunk_at is None:
                        self.first_chunk_at = self.request.clock.now()
                    self._held.append(chunk)
                    self._more.set()
        except Exception as exc:  # the adopter's to raise; a dropped guess's to forget
            log.info("speculative first segment %s failed: %s", self.request.request_id, exc)
            self._error = exc
        finally:
            self._ended = True
            self._more.set()

    async def chunks(self) -> AsyncGenerator[PcmChunk, None]:
        """The held audio, then the rest as the voice makes it; the voice's
        error where it failed. Closing it early drops the synthesis."""
        try:
            while True:
                while self._held:
                    yield self._held.popleft()
                if self._ended:
                    if self._error is not None:
                        raise self._error
                    return
                self._more.clear()
                await self._more.wait()
        finally:
            await self.drop()

    def cancel(self) -> None:
        """Stop the synthesis now (``drop`` waits for it to be stopped)."""
        self._task.cancel()
        self._held.clear()

    async def drop(self) -> None:
        """Stop the synthesis and wait until the voice's request is closed."""
        self.cancel()
        await asyncio.wait([self._task])


__all__ = ["Speculation"]
