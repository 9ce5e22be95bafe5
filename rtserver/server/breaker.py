"""A circuit breaker per voice (engine), pure: ``now`` is always passed in.

closed --(``failures`` failed contexts in a row)--> open: new contexts fail
fast with ``engine_failed`` and ``retry_after_ms``. After the cool-down the
next context is let through as a probe (half-open); its success closes the
breaker, its failure opens it again with the cool-down doubled (up to
``max_cooldown_s``). A probe that reports nothing within a cool-down (it was
cancelled) lets another through. ``dead()`` opens it for good: the engine is
gone and only a restart of the process brings it back.
"""

from __future__ import annotations

import math
from enum import StrEnum

from rtserver.errors import EngineUnavailable
from rtserver.server.admission import retry_ms


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    DEAD = "dead"


class CircuitBreaker:
    def __init__(self, name: str, failures: int, cooldown_s: float,
                 max_cooldown_s: float) -> None:
        if failures < 1 or not 0 < cooldown_s <= max_cooldown_s:
            raise ValueError("failures >= 1 and 0 < cooldown_s <= max_cooldown_s")
        self.name = name
        self._threshold = failures
        self._base_cooldown = cooldown_s
        self._max_cooldown = max_cooldown_s
        self._cooldown = cooldown_s
        self.state = BreakerState.CLOSED
        self.failures = 0  # in a row
        self._opened_at = 0.0
        self._probe_at: float | None = None
        self.reason = ""

    def admit(self, now: float, context: str | None = None) -> None:
        """A new context wants this voice: return, or raise ``EngineUnavailable``."""
        if self.state is BreakerState.CLOSED:
            return
        if self.state is BreakerState.DEAD:
            raise EngineUnavailable(f"voice {self.name} is down: {self.reason}",
                                    context=context)
        if self.state is BreakerState.OPEN:
            wait = self._opened_at + self._cooldown - now
            if wait > 0:
                raise EngineUnavailable(
                    f"voice {self.name} failed {self.failures} times in a row; "
                    "retrying it shortly", context=context, retry_after_ms=retry_ms(wait))
            self.state = BreakerState.HALF_OPEN
            self._probe_at = now
            return  # this context is the probe
        # half-open: one probe at a time, another once the last one went quiet
        assert self._probe_at is not None
        wait = self._probe_at + self._cooldown - now
        if wait > 0:
            raise EngineUnavailable(f"voice {self.name} is being retried",
                                    context=context, retry_after_ms=retry_ms(wait))
        self._probe_at = now

    def success(self, now: float) -> None:
        """The voice produced audio for a context."""
        if self.state is BreakerState.DEAD:
            return
        self.state = BreakerState.CLOSED
        self.failures = 0
        self._cooldown = self._base_cooldown
        self._probe_at = None

    def failure(self, now: float, reason: str = "") -> None:
        """A context failed in the voice or its engine."""
        if self.state is BreakerState.DEAD:
            return
        self.failures += 1
        self.reason = reason or self.reason
        if self.state is BreakerState.HALF_OPEN:
            self._cooldown = min(self._max_cooldown, self._cooldown * 2)
            self._open(now)
        elif self.failures >= self._threshold:
            self._open(now)

    def dead(self, reason: str) -> None:
        """The engine is gone for good (``EngineDeadError``)."""
        self.state = BreakerState.DEAD
        self.reason = reason

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self._opened_at = now
        self._probe_at = None

    def up(self, now: float) -> bool:
        """Whether new contexts can be served (closed, or a probe may go):
        ``/ready`` and ``rtserver_engine_up`` read this."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return now >= self._opened_at + self._cooldown
        if self.state is BreakerState.HALF_OPEN:
            return True
        return False

    def retry_after_s(self, now: float) -> float:
        """Seconds until a context may be tried (inf when dead, 0 when up)."""
        if self.state is BreakerState.DEAD:
            return math.inf
        if self.state is BreakerState.OPEN:
            return max(0.0, self._opened_at + self._cooldown - now)
        return 0.0


__all__ = ["BreakerState", "CircuitBreaker"]
