"""One segment's model frames in, its PCM out, along a chunk plan: the part of a
vocoder stream that does not depend on the model (SNAC codes, ChatTTS steps).

A ``PlannedStream`` keeps the frames a future window may still need
(``FrameHistory``), asks its ``ChunkPlanner`` which windows are due, decodes them
through the shared ``DecodeBatcher`` (one call per tick across streams) and joins
the seams with a ``SeamJoiner``. A subclass says how input is checked
(``_check``), how a window is built (``_window``) and, optionally, how decoded
audio is checked (``_check_audio``). Calls on one stream must not overlap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk
from rtserver.vocoder.batcher import DecodeBatcher, FrameWindow
from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob, SeamJoiner

W = TypeVar("W", bound=FrameWindow)

# A stream's decodes may wait for company in the batcher (``BatcherConfig.hold_s``)
# once it has emitted this much audio (its listener then has that much queued,
# less what it played), or while its listener holds this much beyond the decode
# (a later segment of a context, ``held_s``); a segment's first chunk is
# urgent (never held, the first lane) unless its listener holds that much: a
# context's first audio, which sets time to first heard audio, always is.
HOLD_AFTER_S = 1.0


class FrameHistory:
    """A stream's frames still needed, in one growable array (amortised O(1)
    append; a push never copies the whole history)."""

    __slots__ = ("base", "data", "n")

    def __init__(self, width: int, dtype: type[np.generic]) -> None:
        self.data: npt.NDArray[Any] = np.zeros((64, width), dtype=dtype)
        self.base = 0  # frame index of data[0]
        self.n = 0  # rows in use

    def append(self, rows: npt.NDArray[Any]) -> None:
        need = self.n + len(rows)
        if need > len(self.data):
            grown = np.zeros((max(need, 2 * len(self.data)), self.data.shape[1]),
                             dtype=self.data.dtype)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[self.n:need] = rows
        self.n = need

    def window(self, start: int, end: int) -> npt.NDArray[Any]:
        """Frames ``[start, end)`` as a copy (the history moves on)."""
        return self.data[start - self.base:end - self.base].copy()

    def drop_before(self, frame: int) -> None:
        k = frame - self.base
        if k <= 0:
            return
        if k >= self.n:
            self.base, self.n = frame, 0
            return
        self.data[:self.n - k] = self.data[k:self.n]
        self.n -= k
        self.base = frame


class PlannedStream(ABC, Generic[W]):
    """The push / finish / close cycle of one segment (see the module docstring)."""

    __slots__ = ("_batcher", "_busy", "_closed", "_first_at", "_held_until", "_history",
                 "_joiner", "_planner", "_sample_rate")

    # "vocoder stream" in errors; subclasses name their model
    _what = "vocoder stream"

    def __init__(self, batcher: DecodeBatcher[W], chunking: ChunkConfig, *,
                 samples_per_frame: int, sample_rate: int, width: int,
                 dtype: type[np.generic], held_s: float | None = None) -> None:
        self._batcher = batcher
        self._planner = ChunkPlanner(chunking)
        self._joiner = SeamJoiner(samples_per_frame)
        self._sample_rate = sample_rate
        self._history = FrameHistory(width, dtype)
        self._busy = False
        self._closed = False
        self._first_at: float | None = None  # when the first audio came out (batcher clock)
        # when the listener has played what it held before this segment (batcher clock)
        self._held_until = None if held_s is None else batcher.clock() + max(0.0, held_s)

    @property
    def chunking(self) -> ChunkConfig:
        """The plan this segment's decodes follow."""
        return self._planner.config

    @property
    def frames(self) -> int:
        """Frames pushed so far."""
        return self._planner.frames

    @property
    def emitted_samples(self) -> int:
        """Samples of audio this stream has emitted (or is decoding now)."""
        return self._planner.emitted_samples

    @property
    def closed(self) -> bool:
        return self._closed

    @abstractmethod
    def _check(self, x: Any) -> npt.NDArray[Any]:
        """Validate pushed frames and return them as the history's dtype."""

    @abstractmethod
    def _window(self, frames: npt.NDArray[Any], start_frame: int) -> W:
        """The batcher's window for frames starting at ``start_frame``."""

    def _check_audio(self, audio: list[Any]) -> None:
        """Raise if decoded audio is unusable (the stream is closed first)."""

    async def push(self, x: Any) -> list[PcmChunk]:
        """Add frames; return the audio now final."""
        arr = self._check(x)
        self._enter()
        try:
            self._history.append(arr)
            return await self._run(self._planner.push(len(arr), deep=self._deep()))
        finally:
            self._busy = False

    async def finish(self) -> list[PcmChunk]:
        """No more frames: the rest of the audio (no lookahead left to wait for)."""
        self._enter()
        try:
            chunks = await self._run(self._planner.finish())
        finally:
            self._busy = False
        self.close()
        return chunks

    def close(self) -> None:
        """Drop the stream's state (cancel); a push in flight then returns nothing."""
        self._closed = True
        self._history = FrameHistory(self._history.data.shape[1],
                                     self._history.data.dtype.type)

    def _plays_from(self) -> float | None:
        """When (on the batcher's clock) the listener starts playing this
        segment's audio: once it has played what it held before (``held_s``)
        or at the segment's first audio, whichever is later, and then without
        a pause; None while neither is known."""
        known = [t for t in (self._held_until, self._first_at) if t is not None]
        return max(known) if known else None

    def _deep(self) -> bool:
        """The listener holds a deep chunk's worth of audio (``ChunkConfig.
        deep_chunk_frames``) beyond what this segment has emitted so far."""
        need = self._planner.deep_buffer_samples
        if not need:  # off (the default): nothing to work out on every push
            return False
        start = self._plays_from()
        if start is None:
            return False
        queued_s = start + self.emitted_samples / self._sample_rate - self._batcher.clock()
        return queued_s * self._sample_rate >= need

    def _enter(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._what} is closed")
        if self._busy:
            raise RuntimeError(f"overlapping calls on one {self._what}")
        self._busy = True

    async def _run(self, jobs: list[DecodeJob]) -> list[PcmChunk]:
        if not jobs:
            return []
        windows = [self._window(self._history.window(j.start_frame, j.end_frame), j.start_frame)
                   for j in jobs]
        self._history.drop_before(self._planner.first_needed_frame())
        # the listener has played everything before this decode's first sample by then
        start = self._plays_from()
        deadline = None if start is None else start + jobs[0].emit_start / self._sample_rate
        # a segment whose listener holds HOLD_AFTER_S of audio before this decode
        # (from earlier segments) is not in a hurry, its first decode included:
        # the first lane is left to contexts' first audio
        ahead = deadline is not None and deadline - self._batcher.clock() >= HOLD_AFTER_S
        try:
            audio = await self._batcher.decode(
                windows, urgent=jobs[0].index == 0 and not ahead,
                may_wait=ahead or jobs[0].emit_start >= HOLD_AFTER_S * self._sample_rate,
                deadline=deadline)
        except BaseException:
            self.close()  # the schedule moved on without this audio: unusable
            raise
        if self._closed:
            return []
        try:
            self._check_audio(audio)
        except BaseException:
            self.close()
            raise
        chunks = [PcmChunk(self._joiner.join(j, a), self._sample_rate)
                  for j, a in zip(jobs, audio, strict=True)]
        out = [c for c in chunks if len(c.samples)]
        if out and self._first_at is None:
            self._first_at = self._batcher.clock()
        return out
