"""Cross-stream batching of decoder calls, run off the event loop.

Every window (any type with ``n_frames``: SNAC code windows, ChatTTS step
windows) submitted while the decoder is busy (or in the same loop tick)
goes into the next call: one worker task takes all queued windows, groups them
by length (padding within a group is exact, see ``snac_model``), and runs the
group decodes on one dedicated thread, so the event loop never waits on a
decode (torch releases the GIL while it computes). Windows marked ``urgent``
(a stream's first chunk: it sets TTFA) are taken first, decoded in their own
call ahead of the rest, and answered as soon as that call returns. The rest are
taken in arrival order, or (``BatcherConfig.order`` "deadline") earliest
deadline first: when the decoder cannot take every queued window in one call,
the streams nearest an underrun go in the next one.

With a *first lane* (``enable_first_lane``: a decoder that may run beside the
main one, on CUDA the SNAC decoder's second set of graphs on its own stream),
urgent windows that fit it are decoded there by a second worker and thread, so
a first chunk never waits for a long call in flight; without one, a first
chunk arriving during a call waits for it (``max_batch_frames`` bounds that).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


class FrameWindow(Protocol):
    """A window of one stream's frames (SNAC ``CodeWindow``, ChatTTS ``StepWindow``)."""

    @property
    def n_frames(self) -> int: ...


W = TypeVar("W", bound=FrameWindow)
W_contra = TypeVar("W_contra", bound=FrameWindow, contravariant=True)


class WindowDecoder(Protocol[W_contra]):
    """Decodes windows to audio, one array per window, in order."""

    def decode(self, windows: Sequence[W_contra]) -> list[FloatArray]: ...


class LaneDecoder(WindowDecoder[W_contra], Protocol[W_contra]):
    """A decoder for a second thread, for the shapes it ``fits`` only."""

    def fits(self, windows: int, frames: int) -> bool: ...


QUEUE_ORDERS = ("arrival", "deadline")


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    max_batch: int = 64  # windows per decoder call
    # Frames per call, padding included: bounds memory, and the wait of a first
    # chunk that arrives while a call runs (H200, eager: ~0.06 ms a frame at 64
    # windows, so 512 frames ~ 32 ms).
    max_batch_frames: int = 512
    # A group's padded frames may exceed its real frames by this fraction
    # (0: only equal lengths share a call). GPU calls are launch-bound: pad
    # freely; CPU cost follows frames: pad little.
    max_pad_fraction: float = 0.25
    # Hold: a window that is not urgent may wait up to this long for others to
    # join its call, unless ``max_batch`` windows are queued first (0: decode at
    # once). A GPU decoder costs per call far more than per window at small
    # batches (ChatTTS, H200: 2.4 ms for 1 steady window, 0.27 ms a window at 64
    # in bf16; ``bench/results/h200-chattts-decode-2026-12-04``), so a short hold
    # buys throughput; it delays a stream's later chunks once, by at most this.
    hold_s: float = 0.0
    # ...and never past its stream's deadline (``decode(deadline=)``: when a
    # listener who started playing at the stream's first chunk would have heard
    # all its audio) less this margin: a decode call (H200, ChatTTS: ~17 ms at 64
    # windows, ``bench/results/h200-chattts-decode-2026-12-04``), the hand-off to
    # the front end, Opus and the network. So the hold follows the listeners'
    # buffer levels: a stream about to run dry is decoded at once.
    hold_margin_s: float = 0.1
    # The order windows that are not urgent are taken in: "arrival", or
    # "deadline" (earliest ``decode(deadline=)`` first; none: the time of the
    # call). Near capacity deadline order serves the streams about to run dry
    # first; past it, it serves those already late, which every textbook EDF
    # overload shows cascading. Its only GPU runs (H100, 256 Orpheus streams)
    # met a host losing 5-20 % to steal: no verdict
    # (bench/results/h100-2026-12-08-s34). Arrival: what every figure since
    # the batcher's start was measured with.
    order: str = "arrival"

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_batch_frames < 1:
            raise ValueError("max_batch and max_batch_frames must be >= 1")
        if self.max_pad_fraction < 0:
            raise ValueError("max_pad_fraction must be >= 0")
        if not 0 <= self.hold_s <= 1:
            raise ValueError("hold_s must be in [0, 1]")
        if self.hold_margin_s < 0:
            raise ValueError("hold_margin_s must be >= 0")
        if self.order not in QUEUE_ORDERS:
            raise ValueError(f"order must be one of {', '.join(QUEUE_ORDERS)}, not {self.order!r}")


@dataclass(slots=True)
class BatcherStats:
    """Counters since start; ``snapshot()`` for a consistent copy."""

    ticks: int = 0  # times the worker took work from the queue
    calls: int = 0  # decoder calls
    first_lane_calls: int = 0  # of which on the first lane
    windows: int = 0
    frames: int = 0
    padded_frames: int = 0  # frames computed, padding included
    decode_seconds: float = 0.0  # wall time inside decoder calls
    failures: int = 0
    call_sizes: dict[int, int] = field(default_factory=dict)  # windows per call -> count

    def snapshot(self) -> BatcherStats:
        return replace(self, call_sizes=dict(self.call_sizes))


def device_batcher_config(cuda: bool, *, max_batch: int, max_batch_frames: int,
                          max_pad_fraction: float, hold_s: float,
                          order: str = "arrival") -> BatcherConfig:
    """A vocoder's batcher settings, a negative ``max_pad_fraction`` or
    ``hold_s`` meaning the device's default: on CUDA calls are launch-bound, so
    pad freely (4.0) and hold later chunks 40 ms; on the CPU cost follows
    frames, so pad little (0.25) and never hold."""
    return BatcherConfig(
        max_batch=max_batch, max_batch_frames=max_batch_frames,
        max_pad_fraction=max_pad_fraction if max_pad_fraction >= 0 else (4.0 if cuda else 0.25),
        hold_s=hold_s if hold_s >= 0 else (0.04 if cuda else 0.0), order=order)


def group_windows(lengths: Sequence[int], cfg: BatcherConfig) -> list[list[int]]:
    """Split indices into decoder calls: sorted by length, bounded waste and size."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    cur: list[int] = []
    real = 0
    for i in order:
        n = lengths[i]
        if cur:
            longest = lengths[cur[0]]
            padded = longest * (len(cur) + 1)
            if (len(cur) >= cfg.max_batch or padded > cfg.max_batch_frames
                    or padded > (1 + cfg.max_pad_fraction) * (real + n)):
                groups.append(cur)
                cur, real = [], 0
        cur.append(i)
        real += n
    if cur:
        groups.append(cur)
    return groups


class _Item(Generic[W]):
    __slots__ = ("future", "hold_until", "key", "urgent", "window")

    def __init__(self, window: W, future: asyncio.Future[FloatArray],
                 urgent: bool, hold_until: float | None, key: tuple[float, int]) -> None:
        self.window, self.future, self.urgent = window, future, urgent
        self.hold_until = hold_until  # None: decode at once
        self.key = key  # the normal queue's order: (deadline or 0, arrival)

    def __lt__(self, other: _Item[W]) -> bool:
        return self.key < other.key


class DecodeBatcher(Generic[W]):
    """Owns the decode thread. ``start`` before ``decode``; ``close`` at the end."""

    def __init__(self, decoder: WindowDecoder[W], config: BatcherConfig | None = None, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._decoder = decoder
        self._cfg = config or BatcherConfig()
        self._clock = clock
        self.clock = clock  # the time ``decode``'s deadlines are on
        self._urgent: deque[_Item[W]] = deque()
        self._normal: list[_Item[W]] = []  # a heap on ``_Item.key``
        self._arrivals = itertools.count()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # the first lane: decoder, its urgent queue, wake-up, worker, thread
        self._lane: LaneDecoder[W] | None = None
        self._lane_queue: deque[_Item[W]] = deque()
        self._lane_wake = asyncio.Event()
        self._lane_worker: asyncio.Task[None] | None = None
        self._lane_executor: ThreadPoolExecutor | None = None
        self._closing = False
        self.stats = BatcherStats()

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._closing

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The decode thread (for other work that must run on it, e.g. warm-up)."""
        if self._executor is None:
            raise RuntimeError("the vocoder batcher is not started")
        return self._executor

    async def start(self) -> None:
        if self._worker is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vocoder-decode")
        self._worker = asyncio.get_running_loop().create_task(self._run(self._loop),
                                                                name="vocoder-batcher")

    def enable_first_lane(self, lane: LaneDecoder[W]) -> None:
        """From now on, urgent windows that ``lane`` fits decode on it, on a
        second thread, beside the main calls. Once, after ``start``."""
        if self._worker is None or self._closing or self._lane is not None:
            raise RuntimeError("enable_first_lane: once, on a running batcher")
        self._lane = lane
        self._lane_executor = ThreadPoolExecutor(1, thread_name_prefix="vocoder-first")
        self._lane_worker = asyncio.get_running_loop().create_task(
            self._run(self._lane_loop), name="vocoder-first-lane")

    async def close(self) -> None:
        """Decode what is queued, then stop the workers and their threads."""
        if self._worker is None or self._closing:
            return
        self._closing = True
        self._wake.set()
        self._lane_wake.set()
        try:
            await self._worker
            if self._lane_worker is not None:
                await self._lane_worker
        finally:
            self._fail_queued(RuntimeError("vocoder closed"))
            assert self._executor is not None
            self._executor.shutdown(wait=True)
            if self._lane_executor is not None:
                self._lane_executor.shutdown(wait=True)

    def _fail_queued(self, exc: BaseException) -> None:
        items = [*self._urgent, *self._normal, *self._lane_queue]
        for q in (self._urgent, self._normal, self._lane_queue):
            q.clear()
        for item in items:
            if not item.future.done():
                item.future.set_exception(exc)

    async def decode(self, windows: Sequence[W], *, urgent: bool = False,
                     may_wait: bool = False, deadline: float | None = None
                     ) -> list[FloatArray]:
        """Audio of each window, decoded in the next batched call(s). ``may_wait``:
        the windows may be held up to ``hold_s`` for company (their stream has
        audio buffered ahead), and up to ``deadline`` (on ``clock``) less
        ``hold_margin_s`` when given; others are decoded at once, with what is
        held. ``deadline`` orders the queue too, with ``order`` "deadline"."""
        if not self.running:
            raise RuntimeError("the vocoder batcher is not running")
        if not windows:
            return []
        loop = asyncio.get_running_loop()
        now = self._clock()
        hold_until = None
        if may_wait and not urgent:
            hold_until = now + self._cfg.hold_s
            if deadline is not None:
                hold_until = min(hold_until, deadline - self._cfg.hold_margin_s)
        by_deadline = self._cfg.order == "deadline"
        key = ((now if deadline is None else deadline) if by_deadline else 0.0,
               next(self._arrivals))
        items = [_Item(w, loop.create_future(), urgent, hold_until, key) for w in windows]
        lane = self._lane
        if urgent and lane is not None and lane.fits(
                1, max(w.n_frames for w in windows)):
            self._lane_queue.extend(items)
            self._lane_wake.set()
        else:
            if urgent:
                self._urgent.extend(items)
            else:
                for item in items:
                    heapq.heappush(self._normal, item)
            self._wake.set()
        return list(await asyncio.gather(*(i.future for i in items)))

    def _take(self) -> list[_Item[W]]:
        """The next call's windows: the urgent ones in arrival order, then the
        others in ``order``, within ``max_batch`` and ``max_batch_frames``."""
        batch: list[_Item[W]] = []
        frames = 0
        normal = self._normal
        for q, pop in ((self._urgent, self._urgent.popleft),
                       (normal, lambda: heapq.heappop(normal))):
            while q and len(batch) < self._cfg.max_batch:
                item = q[0]
                n = item.window.n_frames
                if batch and frames + n > self._cfg.max_batch_frames:
                    return batch
                pop()
                if item.future.done():  # its stream was cancelled
                    continue
                batch.append(item)
                frames += n
        return batch

    async def _run(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run a worker loop; if it dies, fail what is queued instead of hanging it."""
        try:
            await body()
        except BaseException as exc:  # a bug here must not leave pushes waiting forever
            self._closing = True
            self._fail_queued(RuntimeError(f"vocoder batcher stopped: {exc!r}"))
            raise

    def _hold_left(self) -> float:
        """Seconds the queued windows may still wait for company (0: decode now)."""
        hold = self._cfg.hold_s
        q = self._normal
        if hold <= 0 or self._closing or self._urgent or not q:
            return 0.0
        if len(q) >= self._cfg.max_batch:
            return 0.0
        until = min((i.hold_until if i.hold_until is not None else 0.0) for i in q)
        return max(0.0, until - self._clock())

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let the rest of this tick's pushes queue up
            while (left := self._hold_left()) > 0:
                # wait for more windows (a push sets the event), at most ``left``
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):  # not wait_for: cpython#86296
                        await self._wake.wait()
                self._wake.clear()
            while batch := self._take():
                self.stats.ticks += 1
                # Urgent windows (first chunks) form their own calls, run first,
                # and their streams get audio before the rest of the tick is done.
                for urgent in (True, False):
                    part = [i for i in batch if i.urgent == urgent]
                    lengths = [i.window.n_frames for i in part]
                    for group in group_windows(lengths, self._cfg):
                        await self._call(loop, [part[g] for g in group])
            if self._closing:
                return

    async def _lane_loop(self) -> None:
        """The first lane's worker: every queued urgent window, in calls the lane fits."""
        loop = asyncio.get_running_loop()
        lane, q = self._lane, self._lane_queue
        assert lane is not None
        while True:
            await self._lane_wake.wait()
            self._lane_wake.clear()
            await asyncio.sleep(0)  # let the rest of this tick's first chunks queue up
            while q:
                part: list[_Item[W]] = []
                longest = 0
                while q and (not part or lane.fits(len(part) + 1, max(
                        longest, q[0].window.n_frames))):
                    item = q.popleft()
                    if not item.future.done():
                        part.append(item)
                        longest = max(longest, item.window.n_frames)
                self.stats.ticks += 1
                await self._call(loop, part, lane=True)
            if self._closing:
                return

    async def _call(self, loop: asyncio.AbstractEventLoop, items: list[_Item[W]], *,
                    lane: bool = False) -> None:
        items = [i for i in items if not i.future.done()]  # drop cancelled streams'
        if not items:
            return
        windows = [i.window for i in items]
        try:
            results, seconds = await loop.run_in_executor(
                self._lane_executor if lane else self._executor, self._decode, windows, lane)
        except Exception as exc:
            self.stats.failures += 1
            for item in items:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        self._count(windows, seconds, lane)
        for item, audio in zip(items, results, strict=True):
            if not item.future.done():
                item.future.set_result(audio)

    def _decode(self, windows: list[W], lane: bool = False
                ) -> tuple[list[FloatArray], float]:
        """One decoder call and its wall time; runs on the decode thread (or
        the first lane's). Counters are updated by the caller, on the loop."""
        t0 = self._clock()
        decoder = self._lane if lane else self._decoder
        assert decoder is not None
        audio = decoder.decode(windows)
        seconds = self._clock() - t0
        if len(audio) != len(windows):
            raise RuntimeError("decoder returned a different number of arrays than windows")
        return audio, seconds

    def _count(self, windows: list[W], seconds: float, lane: bool) -> None:
        lengths = [w.n_frames for w in windows]
        st = self.stats
        st.decode_seconds += seconds
        st.calls += 1
        st.first_lane_calls += lane
        st.call_sizes[len(windows)] = st.call_sizes.get(len(windows), 0) + 1
        st.windows += len(windows)
        st.frames += sum(lengths)
        st.padded_frames += max(lengths) * len(windows)
