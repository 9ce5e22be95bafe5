"""SDK helpers around a context: pipe tokens in, report what was heard,
place words in time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from rtserver.client.context import ContextStream


async def send_tokens(ctx: ContextStream, tokens: AsyncIterable[str] | Iterable[str], *,
                      end: bool = True) -> int:
    """Pipe a token stream (an LLM's reply as it is generated) into ``ctx``,
    each fragment as it arrives, then ``end`` it (unless ``end=False``).
    Returns the characters sent. Empty fragments are skipped."""
    sent = 0
    if isinstance(tokens, AsyncIterable):
        async for token in tokens:
            if token:
                await ctx.send_text(token)
                sent += len(token)
    else:
        for token in tokens:
            if token:
                await ctx.send_text(token)
                sent += len(token)
    if end:
        await ctx.end()
    return sent


async def openai_text(chunks: AsyncIterable[Any]) -> AsyncIterator[str]:
    """The text of an OpenAI-style chat completion stream
    (``client.chat.completions.create(..., stream=True)``): each chunk's
    ``choices[0].delta.content``, skipping chunks without text."""
    async for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else chunk.choices
        if not choices:
            continue
        delta = choices[0]["delta"] if isinstance(choices[0], dict) else choices[0].delta
        text = delta.get("content") if isinstance(delta, dict) else delta.content
        if text:
            yield text


async def report_played(ctx: ContextStream, heard_ms: Callable[[], float], *,
                        every_s: float = 0.25) -> None:
    """Tell the server how much of ``ctx`` the listener has heard: sends
    `played` with ``heard_ms()`` every ``every_s`` while it grows, until the
    context finishes. Run it as a task beside the player; cancel it or let
    it end with the context."""
    last = -1.0
    while not ctx.finished:
        now = float(heard_ms())
        if now > last:
            await ctx.played(now)
            last = now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):  # not wait_for: cpython#86296
                await ctx.wait()


def word_times(text: str, start_s: float, end_s: float) -> list[tuple[str, float]]:
    """The words of a segment's ``text`` with start times spread over
    [start_s, end_s) by the character offset each word begins at. The server
    reports when each segment starts (``segment.seq * frame_ms``); the next
    segment's start (or ``done.audio_ms``) is where it ends."""
    words: list[tuple[str, float]] = []
    n = max(1, len(text))
    pos = 0
    for word in text.split():
        at = text.index(word, pos)
        pos = at + len(word)
        words.append((word, start_s + (end_s - start_s) * at / n))
    return words


__all__ = [
    "openai_text",
    "report_played",
    "send_tokens",
    "word_times",
]
