"""What every batched vocoder shares: one decode thread for all of a family's
streams (``DecodeBatcher``), its chunk plan and counters, start and close.

A family's vocoder (``SnacVocoder``, ``ChatTTSVocoder``) says only how it
warms up and whether it has a first lane; its streams are ``PlannedStream``s.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from rtserver.vocoder.batcher import BatcherStats, DecodeBatcher, FrameWindow
from rtserver.vocoder.chunking import ChunkConfig

W = TypeVar("W", bound=FrameWindow)


class BatchedVocoder(ABC, Generic[W]):
    """Owns the batcher; ``start`` before opening streams, ``close`` after."""

    def __init__(self, batcher: DecodeBatcher[W], chunking: ChunkConfig,
                 first_chunking: ChunkConfig | None = None) -> None:
        self._batcher = batcher
        self._chunking = chunking
        self._first_chunking = first_chunking or chunking

    @property
    def chunking(self) -> ChunkConfig:
        """The chunk plan (one frame = one model step); ``chunking.stream_plan`` takes it."""
        return self._chunking

    @property
    def first_chunking(self) -> ChunkConfig:
        """The chunk plan of a context's first segment (``open_stream(first=True)``)."""
        return self._first_chunking

    @property
    def stats(self) -> BatcherStats:
        """Batching counters (calls, call sizes, decode seconds) for metrics."""
        return self._batcher.stats.snapshot()

    async def start(self, *, warm_up: bool = True) -> None:
        """Start the decode thread; ``warm_up`` runs ``_warm_up`` on it (one
        decode, and on CUDA with graphs their capture) and opens the first lane
        it returns, before returning."""
        await self._batcher.start()
        if warm_up:
            lane = await asyncio.get_running_loop().run_in_executor(
                self._batcher.executor, self._warm_up)
            if lane is not None:
                self._batcher.enable_first_lane(lane)

    @abstractmethod
    def _warm_up(self) -> Any:
        """On the decode thread: pay first-call costs; return the first lane's
        decoder (its own graphs and stream), or None without one."""

    async def close(self) -> None:
        await self._batcher.close()
