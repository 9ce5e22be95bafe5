"""Waiting in tests: poll a state the test can observe until it holds.

A test that crosses threads or processes (a server thread, a server process,
a browser) waits for what it needs to be true, never for a fixed time: the
poll interval is only how often it looks, and the deadline is a generous
limit that only a broken run reaches. Deadlines are multiplied by
``RTSERVER_TEST_TIMEOUT_SCALE`` (default 1), for machines slower or busier
than the 2-core CI box.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

SCALE_ENV = "RTSERVER_TEST_TIMEOUT_SCALE"
DEFAULT_LIMIT_S = 60.0  # before scaling: generous, only a broken run waits this long
POLL_S = 0.02


def timeout_scale() -> float:
    """The factor ``RTSERVER_TEST_TIMEOUT_SCALE`` sets (a positive number; 1 unset)."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={raw!r} is not a number") from None
    if not scale > 0:
        raise ValueError(f"{SCALE_ENV}={raw!r} must be above 0")
    return scale


def scaled(seconds: float) -> float:
    """A wall-clock limit of ``seconds`` on this machine (``timeout_scale()`` times)."""
    return seconds * timeout_scale()


def _timed_out(what: str, limit_s: float, last: object) -> TimeoutError:
    return TimeoutError(f"{what}: still not true after {limit_s:.1f} s (last: {last!r}; "
                        f"{SCALE_ENV} scales the limit)")


def wait_until(check: Callable[[], T], what: str, limit_s: float = DEFAULT_LIMIT_S,
               poll_s: float = POLL_S) -> T:
    """``check()`` until it returns a truthy value; that value. ``TimeoutError``
    naming ``what`` once ``scaled(limit_s)`` seconds have passed."""
    limit_s = scaled(limit_s)
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, limit_s, value)
        time.sleep(poll_s)


async def wait_until_async(check: Callable[[], T | Awaitable[T]], what: str,
                           limit_s: float = DEFAULT_LIMIT_S, poll_s: float = POLL_S) -> T:
    """``wait_until`` on an event loop: ``check`` may be a plain function or
    return an awaitable; between looks the loop runs other tasks."""
    limit_s = scaled(limit_s)
    deadline = time.monotonic() + limit_s
    while True:
        got = check()
        value = await got if inspect.isawaitable(got) else got
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, limit_s, value)
        await asyncio.sleep(poll_s)
