"""A context's input: text fragments, ``flush`` and ``end`` in the order the
transport gave them, held until the context's segment loop takes them.

Putting never blocks (the transport's reader calls it) and is bounded: a
context takes at most ``max_chars`` characters of text in all (the server's
``max_text_chars``), and past them ``feed`` raises ``TextTooLong`` and keeps
nothing of the fragment. Nothing else grows: an empty fragment changes
nothing and is not kept, a ``flush`` right behind a ``flush`` would speak
nothing and is not kept, and ``wake`` is a flag, not an item. So the queue
holds at most ``2 * max_chars + 2`` items, whose text is at most
``max_chars`` characters. Input after ``end`` is the transport's bug
(``ValueError``); the WebSocket session refuses it, and the text limit,
before the core sees either.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass

from rtserver.clock import Clock
from rtserver.errors import TextTooLong

# ``[server] max_text_chars``' default (rtserver/config.py; a test keeps them
# equal): what a core built without a config takes per context.
DEFAULT_MAX_TEXT_CHARS = 50_000


class InputKind(enum.Enum):
    TEXT = "text"
    FLUSH = "flush"
    END = "end"


@dataclass(frozen=True, slots=True)
class Input:
    kind: InputKind
    text: str = ""
    at: float = 0.0  # when it was received
    end: int = 0  # characters received in the context up to and including it


class ContextInput:
    """The input of one context: ``feed``/``flush``/``end`` put, ``next``
    takes (one consumer: the segment loop)."""

    def __init__(self, context: str, clock: Clock, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, not {max_chars}")
        self.context = context
        self.max_chars = max_chars
        self.chars_in = 0  # characters received
        self.ended = False
        self._clock = clock
        self._items: deque[Input] = deque()
        self._woken = False
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        """Inputs held, not yet taken."""
        return len(self._items)

    def feed(self, text: str) -> None:
        """Append a fragment; ``TextTooLong`` past ``max_chars`` in all."""
        self._check_open("feed")
        if not text:
            return
        if self.chars_in + len(text) > self.max_chars:
            raise TextTooLong(f"context '{self.context}' would exceed {self.max_chars} "
                              "characters", context=self.context)
        self.chars_in += len(text)
        self._put(Input(InputKind.TEXT, text, self._clock.now(), self.chars_in))

    def flush(self) -> None:
        """Speak what is buffered now."""
        self._check_open("flush")
        if self._items and self._items[-1].kind is InputKind.FLUSH:
            return  # nothing between the two: the second would speak nothing
        self._put(Input(InputKind.FLUSH, at=self._clock.now(), end=self.chars_in))

    def end(self) -> None:
        """No more input."""
        self._check_open("end")
        self.ended = True
        self._put(Input(InputKind.END, at=self._clock.now(), end=self.chars_in))

    def wake(self) -> None:
        """Make a waiting ``next`` return None (its deadlines moved)."""
        self._woken = True
        self._ready.set()

    async def next(self, timeout_s: float | None) -> Input | None:
        """The oldest input; None once ``timeout_s`` passed without one, or
        when woken (``wake``)."""
        if not self._items and not self._woken:
            self._ready.clear()
            # asyncio.timeout, never wait_for: on Python 3.11 wait_for loses a
            # cancel that lands in the tick its wait ends (cpython#86296), and a
            # context cancelled as its text arrived then waited here for ever
            # while its connection's reader waited for it to end
            try:
                async with asyncio.timeout(None if timeout_s is None else max(0.0, timeout_s)):
                    await self._ready.wait()
            except TimeoutError:
                return None
        if self._items:
            return self._items.popleft()
        self._woken = False
        return None

    def _check_open(self, what: str) -> None:
        if self.ended:
            raise ValueError(f"{what} after end")

    def _put(self, item: Input) -> None:
        self._items.append(item)
        self._ready.set()


__all__ = ["DEFAULT_MAX_TEXT_CHARS", "ContextInput", "Input", "InputKind"]
