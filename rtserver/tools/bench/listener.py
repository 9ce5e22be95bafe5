"""A simulated real-time listener (pure): would this context have played
without a gap?

Model (PROTOCOL.md, `buffer`: "buffer this much audio before starting (or
resuming) playback"):

- Frames of ``frame_ms`` each arrive at known times (a binary message holds
  several frames that arrive together).
- The listener waits until it holds at least ``prebuffer_ms`` of audio
  (rounded up to whole frames, at least one frame), using the latest `buffer`
  hint received by then, or ``default_prebuffer_ms`` before any hint; or
  until it holds everything that will ever come (``end_known_at`` passed).
- It then plays in real time: frame ``k`` of a run started at ``T`` with frame
  ``i`` plays at ``T + (k - i) * frame_ms``. If a frame is not there when it
  should play, that is an *underrun*: playback stops, the listener buffers
  again as at the start, and the time from the missed play time to the
  restart is *stalled* time.
- Nothing after the last received frame is an underrun: a cancelled context
  simply stops.

Times are seconds on one clock; durations in the result are milliseconds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-9  # float slack when comparing arrival and play times


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """How the simulated listener buffers.

    ``default_prebuffer_ms`` applies before the first `buffer` hint arrives;
    0 means "start on the first frame" (the most impatient listener).
    ``rebuffer`` re-applies the prebuffer after an underrun (PROTOCOL.md says
    "starting (or resuming)"); without it playback resumes on the next frame.
    """

    default_prebuffer_ms: float = 0.0
    rebuffer: bool = True


@dataclass(frozen=True, slots=True)
class Stall:
    at: float  # when the missing frame should have played
    ms: float  # how long playback stood still


@dataclass(frozen=True, slots=True)
class Playback:
    """What the listener experienced."""

    frames: int
    audio_ms: float
    start_at: float | None  # playback began (None: no frame ever arrived)
    end_at: float | None  # the last frame finished playing
    underruns: int
    stalled_ms: float
    stalls: tuple[Stall, ...]


def _frame_times(arrivals: Sequence[tuple[float, int]]) -> list[float]:
    times: list[float] = []
    for at, count in arrivals:
        if count < 0:
            raise ValueError("a message cannot hold a negative number of frames")
        if times and at < times[-1] - _EPS:
            raise ValueError("arrivals must be in time order")
        times.extend([at] * count)
    return times


def simulate(arrivals: Sequence[tuple[float, int]], frame_ms: float,
             hints: Sequence[tuple[float, float]] = (), *,
             end_known_at: float | None = None,
             config: ListenerConfig = ListenerConfig()) -> Playback:
    """Play a context's frames in real time.

    ``arrivals``: ``(time, frame count)`` per binary message, in order.
    ``hints``: ``(time, prebuffer_ms)`` per `buffer` hint, in order.
    ``end_known_at``: when the listener learns nothing more will come (the
    `last` frame flag, `done` or `cancelled`); defaults to the last arrival.
    """
    if frame_ms <= 0:
        raise ValueError("frame_ms must be > 0")
    a = _frame_times(arrivals)
    n = len(a)
    if n == 0:
        return Playback(0, 0.0, None, None, 0, 0.0, ())
    fm = frame_ms / 1000.0
    end_known = a[-1] if end_known_at is None else max(end_known_at, a[-1])
    hint_times = [t for t, _ in hints]
    hint_values = [ms for _, ms in hints]

    def prebuffer_frames(at: float) -> int:
        k = bisect.bisect_right(hint_times, at + _EPS)
        ms = hint_values[k - 1] if k else config.default_prebuffer_ms
        return max(1, math.ceil(ms / frame_ms - _EPS))

    def arrived_by(at: float) -> int:
        return bisect.bisect_right(a, at + _EPS)

    def buffered_start(t: float, i: int, wait_for_prebuffer: bool) -> float:
        """Earliest time >= t at which playback of frame i may (re)start."""
        candidates = sorted({t, end_known, *(x for x in a[i:] if x > t),
                             *(h for h in hint_times if h > t)})
        for c in candidates:
            have = arrived_by(c) - i
            if have <= 0:
                continue
            if have == n - i and c >= end_known - _EPS:
                return c  # everything is here: nothing to wait for
            need = prebuffer_frames(c) if wait_for_prebuffer else 1
            if have >= need:
                return c
        return max(end_known, t)  # unreachable: the last candidate holds everything

    stalls: list[Stall] = []
    start_at: float | None = None
    i = 0
    t = a[0]
    while True:
        began = buffered_start(t, i, start_at is None or config.rebuffer)
        if start_at is None:
            start_at = began
        else:
            stalls.append(Stall(at=t, ms=(began - t) * 1000.0))
        j = i
        while j < n and a[j] <= began + (j - i) * fm + _EPS:
            j += 1
        if j == n:
            end_at = began + (n - i) * fm
            break
        t = began + (j - i) * fm  # frame j misses its play time
        i = j
    return Playback(frames=n, audio_ms=n * frame_ms, start_at=start_at, end_at=end_at,
                    underruns=len(stalls), stalled_ms=sum(s.ms for s in stalls),
                    stalls=tuple(stalls))
