"""The one clock: monotonic seconds, injected wherever a time is read.

Every time the server compares or subtracts (the ledger's send times, a
voice's marks, the segmenter's timers, hints, deadlines, TTFA) comes from one
``Clock``, so no two readings of different clocks are ever mixed. The real one
reads ``time.monotonic`` (the event loop's timers wait on relative timeouts
computed from it, never on ``loop.time()``: uvloop's is cached per iteration);
tests inject a ``ManualClock``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds (arbitrary origin)."""
        ...


class MonotonicClock:
    """``time.monotonic``."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told (tests, simulations)."""

    __slots__ = ("t",)

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self.t += seconds


SYSTEM_CLOCK: Clock = MonotonicClock()
