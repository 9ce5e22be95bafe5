"""Admission, pure (no asyncio, no sockets; ``now`` is always passed in).

- ``TokenBucket``: a rate with bursts; ``take`` answers how long to wait.
- ``RateLimits``: per API key (or client address) buckets for connections,
  contexts and characters per minute; a refusal raises ``RateLimited`` with
  ``retry_after_ms``.
- ``InputBudget``: what one connection may send, checked before it is
  parsed (bytes and messages a second); over it the connection is held, and
  one held for ``flood_after_s`` is a flood (``ControlFlood``, 1008).
- ``KeyConcurrency``: requests open at once per client key (the HTTP
  speech API's ``http_requests_per_key``); over it ``TooManyContexts``.
- ``StartAdmission``: at most ``max_starting`` contexts starting at once (a
  burst): the rest are refused with ``overloaded`` and a retry time that
  spreads them out.
- ``LoadAdmission``: a new context is refused with ``overloaded`` (``Busy``)
  when its predicted time to first heard audio (``SpeechCore.
  predicted_first_heard_ms``: the core's one first-heard model) would miss
  the configured target.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from rtserver.config import AdmissionConfig
from rtserver.errors import Busy, ControlFlood, RateLimited, TooManyContexts

# A held connection is read again once this many bytes are in its budget.
MIN_PARSE_BYTES = 4096.0
# Retry after a refusal for concurrency: about one short reply's length.
CONCURRENCY_RETRY_MS = 1000


class TokenBucket:
    """``capacity`` tokens, refilled at ``per_s`` a second.

    ``take(n, now)`` takes ``n`` tokens and answers 0.0, or takes nothing and
    answers the seconds until it could. A request larger than the bucket is
    served when the bucket is full and leaves it in debt (so it is slowed,
    never refused for ever)."""

    __slots__ = ("at", "capacity", "level", "per_s")

    def __init__(self, per_s: float, capacity: float, now: float) -> None:
        if not (per_s > 0 and capacity > 0):
            raise ValueError("per_s and capacity must be > 0")
        self.per_s = per_s
        self.capacity = capacity
        self.level = capacity
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.per_s)
            self.at = now

    def take(self, n: float, now: float) -> float:
        self._refill(now)
        need = min(n, self.capacity)
        if self.level >= need - 1e-9:  # float slack: a wait of exactly the answer is enough
            self.level -= n
            return 0.0
        return (need - self.level) / self.per_s

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.level >= self.capacity


def retry_ms(wait_s: float) -> int:
    """A wait in seconds as a ``retry_after_ms`` (rounded up, at least 1)."""
    return max(1, math.ceil(wait_s * 1000.0))


class _Buckets:
    __slots__ = ("chars", "connections", "contexts")

    def __init__(self, config: AdmissionConfig, now: float) -> None:
        def bucket(per_minute: float) -> TokenBucket | None:
            return TokenBucket(per_minute / 60.0, per_minute, now) if per_minute > 0 else None
        self.connections = bucket(config.connections_per_minute)
        self.contexts = bucket(config.contexts_per_minute)
        self.chars = bucket(config.chars_per_minute)


class RateLimits:
    """Token buckets per client key (an API key's id, or the client address).

    At most ``config.rate_keys`` keys are kept, least recently used dropped
    first; a dropped key starts again with full buckets."""

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._keys: OrderedDict[str, _Buckets] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def _buckets(self, key: str, now: float) -> _Buckets:
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Buckets(self._config, now)
            while len(self._keys) > self._config.rate_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return entry

    def connection(self, key: str, now: float) -> None:
        """A new connection from ``key``; raise ``RateLimited`` if over its rate."""
        self._take(self._buckets(key, now).connections, 1, now, "connections")

    def context(self, key: str, now: float, context: str | None = None) -> None:
        """A new context from ``key``."""
        self._take(self._buckets(key, now).contexts, 1, now, "contexts", context)

    def chars(self, key: str, n: int, now: float, context: str | None = None) -> None:
        """``n`` characters of text from ``key``."""
        if n > 0:
            self._take(self._buckets(key, now).chars, n, now, "characters", context)

    def _take(self, bucket: TokenBucket | None, n: float, now: float, what: str,
              context: str | None = None) -> None:
        if bucket is None:
            return
        wait = bucket.take(n, now)
        if wait > 0:
            per_minute = round(bucket.per_s * 60)
            raise RateLimited(f"more than {per_minute} {what} per minute; try again later",
                              context=context, retry_after_ms=retry_ms(wait))


class InputBudget:
    """One connection's input budget, asked before its bytes are parsed.

    Two buckets refill continuously: bytes (``bytes_per_s``, up to
    ``byte_burst``) and messages (``messages_per_s``, up to
    ``message_burst``). ``allowed_bytes(now)`` is how many bytes may be
    parsed now (0: hold the input); ``spend`` takes what was parsed and may
    leave the message bucket in debt (messages are counted once framed).
    ``wait_s(now)`` is how long to hold the input before asking again.

    A connection that has to be held and does not get either bucket back to
    half full for ``flood_after_s`` is a flood: ``allowed_bytes`` and
    ``wait_s`` raise ``ControlFlood``. A client that bursts and then slows
    down refills and starts afresh."""

    __slots__ = ("_burst_b", "_burst_m", "_bytes", "_flood_after_s", "_messages", "_rate_b",
                 "_rate_m", "_t", "over_since")

    def __init__(self, bytes_per_s: float, byte_burst: float, messages_per_s: float,
                 message_burst: float, flood_after_s: float, now: float) -> None:
        if min(bytes_per_s, byte_burst, messages_per_s, message_burst, flood_after_s) <= 0:
            raise ValueError("input budget rates, bursts and flood_after_s must be > 0")
        self._rate_b, self._burst_b = float(bytes_per_s), float(byte_burst)
        self._rate_m, self._burst_m = float(messages_per_s), float(message_burst)
        self._flood_after_s = flood_after_s
        self._bytes, self._messages = self._burst_b, self._burst_m
        self._t = now
        self.over_since: float | None = None  # when it was first held, this time

    def _refill(self, now: float) -> None:
        if now > self._t:
            dt = now - self._t
            self._bytes = min(self._burst_b, self._bytes + dt * self._rate_b)
            self._messages = min(self._burst_m, self._messages + dt * self._rate_m)
            self._t = now

    def _check(self, now: float) -> float:
        """Refill; the seconds until both buckets are out of debt (0: now).
        Raises ``ControlFlood`` for a connection held too long."""
        self._refill(now)
        low = min(self._burst_b, MIN_PARSE_BYTES)  # not a timer per byte
        wait = max(0.0, -self._messages / self._rate_m,
                   (low - self._bytes) / self._rate_b if self._bytes < low else 0.0)
        if wait > 0:
            if self.over_since is None:
                self.over_since = now
            elif now - self.over_since >= self._flood_after_s:
                raise ControlFlood(
                    f"more than {self._rate_m:g} messages or {self._rate_b:g} bytes a second "
                    f"for {self._flood_after_s:g} s; closing")
        elif (self.over_since is not None and self._bytes >= self._burst_b / 2
              and self._messages >= self._burst_m / 2):
            self.over_since = None
        return wait

    def allowed_bytes(self, now: float) -> int:
        """Bytes that may be parsed now (0: hold the input for ``wait_s``)."""
        if self._check(now) > 0:
            return 0
        return int(self._bytes)

    def wait_s(self, now: float) -> float:
        """How long to hold the input before asking again: until the buckets
        are out of debt, but no later than the flood verdict is due."""
        wait = self._check(now)
        if wait > 0 and self.over_since is not None:
            wait = min(wait, max(1e-3, self.over_since + self._flood_after_s - now))
        return wait

    def spend(self, nbytes: int, nmessages: int, now: float) -> None:
        self._refill(now)
        self._bytes -= nbytes
        self._messages -= nmessages


class KeyConcurrency:
    """Requests open at once per client key, at most ``limit`` each (0: no
    limit). ``acquire`` counts one or raises ``TooManyContexts``; every
    successful ``acquire`` is matched by one ``release``. Only keys with
    requests open are kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def open(self, key: str) -> int:
        return self._open.get(key, 0)

    def acquire(self, key: str, what: str = "requests") -> None:
        n = self._open.get(key, 0)
        if self.limit > 0 and n >= self.limit:
            raise TooManyContexts(f"{self.limit} {what} of this client are being served; "
                                  "wait for one to finish", retry_after_ms=CONCURRENCY_RETRY_MS)
        self._open[key] = n + 1

    def release(self, key: str) -> None:
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
        else:
            self._open.pop(key, None)


class StartAdmission:
    """A burst of new contexts is let in ``limit`` at a time.

    A context is starting from its ``start`` to its first audio. A CPU voice
    makes first chunks before anyone's next chunk (its first-chunk lane), so
    a burst of starts holds up every playing context by their whole work:
    on 2 cores, 12 starting at once held and 24 made 23 of 24 underrun
    (issue 27; bench/results/cpu-piper-2026-12-03-bf16-burst: 8 held, 16
    underran). A start over ``limit`` is refused with ``overloaded``; its
    ``retry_after_ms`` is the time a start takes now (``start_ms``: the
    predicted first heard audio) times the number of bursts of ``limit``
    refused in the last ``REFUSALS_WINDOW_S`` before it, so a burst's
    refused clients come back spread out instead of all at once."""

    REFUSALS_WINDOW_S = 2.0

    def __init__(self, limit: int, retry_min_ms: int, retry_max_ms: int) -> None:
        self.limit = limit
        self._retry = (retry_min_ms, retry_max_ms)
        self._refused: list[float] = []  # times of recent refusals

    def check(self, starting: int, now: float, start_ms: Callable[[], float],
              context: str | None = None) -> None:
        """Admit a start while fewer than ``limit`` are starting, else raise ``Busy``."""
        if self.limit <= 0 or starting < self.limit:
            return
        cut = now - self.REFUSALS_WINDOW_S
        self._refused = [t for t in self._refused if t > cut]
        ahead = len(self._refused) // self.limit  # bursts refused before this one
        self._refused.append(now)
        lo, hi = self._retry
        each = start_ms()
        each = each if math.isfinite(each) and each > 0 else float(lo)
        retry = int(min(hi, max(lo, each * (1 + ahead))))
        raise Busy(f"{starting} contexts are starting; at most {self.limit} start at once",
                   context=context, retry_after_ms=retry)


class LoadAdmission:
    """Refuses a new context whose predicted first heard audio misses the target."""

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config

    def check(self, predicted_ms: float, context: str | None = None) -> None:
        """Raise ``Busy`` (``overloaded``) with ``retry_after_ms`` when
        ``predicted_ms`` exceeds the target. The retry is how far over the
        target the prediction is (the load must fall by about that much of
        work), within ``retry_min_ms`` .. ``retry_max_ms``."""
        target = self._config.first_heard_target_ms
        if target <= 0 or not predicted_ms > target:
            return
        over = predicted_ms - target if math.isfinite(predicted_ms) else math.inf
        retry = int(min(self._config.retry_max_ms, max(self._config.retry_min_ms, over)))
        raise Busy(f"the server is at capacity (first audio would be heard after "
                   f"{min(predicted_ms, 1e9):.0f} ms, over the {target:.0f} ms target)",
                   context=context, retry_after_ms=retry)


__all__ = ["CONCURRENCY_RETRY_MS", "InputBudget", "KeyConcurrency", "LoadAdmission", "RateLimits",
           "StartAdmission", "TokenBucket", "retry_ms"]
