"""One server's admission policy, pure (``now`` is passed in): what the
transport and the connections ask before they take on work.

- ``Gate.connection``: rate limit of new connections per client key.
- ``Gate.start``: a new context: refused while draining (``overloaded``), by
  the voice's circuit breaker (``engine_failed``), by the per-key context
  rate (``rate_limited``), when too many contexts are starting at once (a
  burst: ``overloaded``, ``StartAdmission``) or when its predicted time to first heard audio
  misses the target (``overloaded``); each refusal carries ``retry_after_ms``.
- ``Gate.text``: the per-key character rate.
- ``Gate.http``: requests of the HTTP speech API open per key
  (``admission.http_requests_per_key``; ``acquire``/``release``).
- ``Gate.ready``: what ``/ready`` answers (every voice up, not draining).
- ``MessagePace``: one connection's message rate: the reader waits when the
  client sends faster than ``messages_per_s`` (after a burst), and a client
  that keeps it waiting for ``flood_after_s`` is a flood (1008).

Every refusal is counted in ``rtserver_rejected_total{reason}`` by the caller
through ``reject_reason``.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from rtserver.config import AdmissionConfig, ServerConfig
from rtserver.errors import (
    Busy,
    ControlFlood,
    EngineUnavailable,
    RateLimited,
    RtError,
)
from rtserver.server.admission import (
    KeyConcurrency,
    LoadAdmission,
    RateLimits,
    StartAdmission,
    TokenBucket,
)
from rtserver.server.breaker import BreakerState, CircuitBreaker

# A client that keeps its connection's reader waiting this long is flooding.
FLOOD_AFTER_S = 3.0
# Retry after a refusal while draining: time for a reconnect to reach another
# process (a load balancer notices /ready 503 within a probe period or two).
DRAINING_RETRY_MS = 1000


def reject_reason(err: RtError) -> str:
    """The ``rtserver_rejected_total`` reason of a refusal."""
    if isinstance(err, ControlFlood):
        return "control_flood"
    if isinstance(err, RateLimited):
        return "rate_limited"
    if isinstance(err, EngineUnavailable):
        return "breaker_open"
    if isinstance(err, Busy):
        return "draining" if getattr(err, "draining", False) else "overloaded"
    return err.code.value


def max_starting(per_core: float, cores: int | None = None) -> int:
    """Contexts that may be starting at once on this machine (0: no limit)."""
    if per_core <= 0:
        return 0
    return max(1, math.ceil(per_core * (cores or os.cpu_count() or 1)))


class Draining(Busy):
    """A ``start`` while the server drains."""

    draining = True


@runtime_checkable
class VoiceHealth(Protocol):
    """A voice that knows when it cannot serve (one behind a GPU worker
    process, rtserver/worker/remote.py)."""

    def admit(self, context: str) -> None:
        """Raise the refusal of a new context now, or return."""
        ...

    def down(self) -> str | None:
        """Why the voice is down (``/ready`` 503), or None."""
        ...


@runtime_checkable
class SharedStarts(Protocol):
    """A voice whose starts queue in a process other front ends use too
    (a GPU worker's voice): it knows how many of theirs are starting there."""

    def starting_elsewhere(self) -> int:
        """Contexts other front ends are starting with this voice's engine now."""
        ...


@runtime_checkable
class SharedRate(Protocol):
    """A voice whose engine serves other front ends too (a GPU worker's
    voice): its r as measured over all of their requests."""

    def rtf_elsewhere(self) -> float | None:
        """The engine's recent r at its present load; None before any request completed."""
        ...


class Gate:
    def __init__(self, config: AdmissionConfig, voices: Iterable[str]) -> None:
        self.config = config
        self.rates = RateLimits(config)
        self.load = LoadAdmission(config)
        self.http = KeyConcurrency(config.http_requests_per_key)
        self.starts = StartAdmission(max_starting(config.starting_per_core),
                                     config.retry_min_ms, config.retry_max_ms)
        # contexts starting now (the core's count; set by the app)
        self.starting: Callable[[float], int] = lambda now: 0
        # whether a voice's starts count against ``starts``: a voice whose CPU
        # work bounds it (``VoiceInfo.parallel_segments`` > 0, set by the app).
        # A batching GPU engine (in this process or behind a GPU worker) is not
        # limited by this machine's cores; its own capacity admits it.
        self.start_limited: Callable[[str], bool] = lambda voice: True
        self.breakers = {v: CircuitBreaker(v, config.breaker_failures,
                                           config.breaker_cooldown_s,
                                           config.breaker_max_cooldown_s) for v in voices}
        self.health: dict[str, VoiceHealth] = {}  # voices that report their own health
        self.draining = False
        # HMAC key of browser tokens: configured, or made for this process
        self.secret = config.token_secret.encode() or secrets.token_bytes(32)

    def add_voice(self, voice: str) -> None:
        """A voice added at run time gets its own breaker."""
        self.breakers[voice] = CircuitBreaker(voice, self.config.breaker_failures,
                                              self.config.breaker_cooldown_s,
                                              self.config.breaker_max_cooldown_s)

    def remove_voice(self, voice: str) -> None:
        self.breakers.pop(voice, None)
        self.health.pop(voice, None)

    def connection(self, key: str, now: float) -> None:
        self.rates.connection(key, now)

    def start(self, key: str, voice: str, now: float, context: str,
              predicted_ms: Callable[[], float]) -> None:
        """Admit a new context or raise its refusal. ``predicted_ms`` is asked
        only when the cheaper checks pass (and the target is on)."""
        if self.draining:
            raise Draining("the server is draining; reconnect to try again",
                           context=context, retry_after_ms=DRAINING_RETRY_MS)
        breaker = self.breakers.get(voice)
        if breaker is not None:
            breaker.admit(now, context)
        health = self.health.get(voice)
        if health is not None:
            health.admit(context)
        self.rates.context(key, now, context)
        if self.start_limited(voice):
            self.starts.check(self.starting(now), now, predicted_ms, context)
        if self.config.first_heard_target_ms > 0:
            self.load.check(predicted_ms(), context)

    def text(self, key: str, chars: int, now: float, context: str) -> None:
        self.rates.chars(key, chars, now, context)

    def voice_succeeded(self, voice: str, now: float) -> None:
        breaker = self.breakers.get(voice)
        if breaker is not None:
            breaker.success(now)

    def voice_failed(self, voice: str, now: float, reason: str, *, dead: bool = False) -> None:
        breaker = self.breakers.get(voice)
        if breaker is None:
            return
        if dead:
            breaker.dead(reason)
        else:
            breaker.failure(now, reason)

    def engine_up(self, voice: str, now: float) -> bool:
        breaker = self.breakers.get(voice)
        health = self.health.get(voice)
        return (breaker is None or breaker.up(now)) and (health is None or health.down() is None)

    @property
    def engine_dead(self) -> bool:
        return any(b.state is BreakerState.DEAD for b in self.breakers.values())

    def ready(self, now: float) -> tuple[bool, str]:
        """(ready, why not): every voice up and not draining."""
        if self.draining:
            return False, "draining"
        down = [v for v, b in self.breakers.items() if not b.up(now)]
        down += [f"{v} ({why})" for v, h in self.health.items() if (why := h.down()) is not None
                 and v not in down]
        if down:
            return False, "voice down: " + ", ".join(down)
        return True, "ready"


class MessagePace:
    """One connection's message rate (``[server] messages_per_s`` with bursts
    of ``message_burst``): ``wait_s(now)`` is 0 or how long the reader must
    wait before it takes the next message. A client that keeps its bucket
    nearly empty (under half a burst) for ``FLOOD_AFTER_S`` while the reader
    waits on it is a flood: ``ControlFlood`` (1008)."""

    __slots__ = ("_bucket", "_since")

    def __init__(self, config: ServerConfig, now: float) -> None:
        self._bucket = TokenBucket(config.messages_per_s, config.message_burst, now)
        self._since: float | None = None  # when the reader first had to wait

    def wait_s(self, now: float) -> float:
        bucket = self._bucket
        wait = bucket.take(1, now)
        if wait > 0:
            if self._since is None:
                self._since = now
            elif now - self._since > FLOOD_AFTER_S:
                raise ControlFlood(f"more than {bucket.per_s:g} messages a second for "
                                   f"{FLOOD_AFTER_S:g} s; closing")
            return wait
        if self._since is not None and bucket.level >= bucket.capacity / 2:
            self._since = None  # the client slowed down: its bursts refill
        return 0.0


__all__ = ["DRAINING_RETRY_MS", "Draining", "Gate", "MessagePace", "SharedStarts", "VoiceHealth",
           "max_starting", "reject_reason"]
