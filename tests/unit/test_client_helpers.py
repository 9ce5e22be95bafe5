"""The SDK helpers of rtserver.client that need no server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rtserver.client import openai_text, report_played, send_tokens, word_times


def test_word_times_spread_by_character_position() -> None:
    assert word_times("ab cd", 1.0, 2.0) == [("ab", 1.0), ("cd", 1.6)]
    assert word_times("  x", 0.0, 3.0) == [("x", 2.0)]
    assert word_times("", 0.0, 1.0) == []


async def test_openai_text_reads_chat_completion_chunks() -> None:
    chunk_types = pytest.importorskip("openai.types.chat")

    def chunk(content: str | None) -> object:
        return chunk_types.ChatCompletionChunk.model_validate({
            "id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]})

    async def stream() -> AsyncIterator[object]:
        for c in ("Hel", "lo", None, " there."):
            yield chunk(c)
        yield {"choices": [{"delta": {"content": " Dicts too."}}]}
        yield {"choices": []}  # the usage chunk at the end has none

    assert [t async for t in openai_text(stream())] == ["Hel", "lo", " there.", " Dicts too."]


class FakeContext:
    """What send_tokens and report_played use of a ContextStream."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.played_ms: list[float] = []
        self.ended = False
        self._done = asyncio.Event()

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def end(self) -> None:
        self.ended = True

    async def played(self, audio_ms: float) -> None:
        self.played_ms.append(audio_ms)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> None:
        await self._done.wait()


async def test_send_tokens_sends_each_fragment_then_end() -> None:
    ctx = FakeContext()

    async def tokens() -> AsyncIterator[str]:
        for t in ("One", "", " two."):
            yield t

    assert await send_tokens(ctx, tokens()) == 8  # type: ignore[arg-type]
    assert ctx.sent == ["One", " two."] and ctx.ended
    ctx2 = FakeContext()
    await send_tokens(ctx2, ["a", "b"], end=False)  # type: ignore[arg-type]
    assert ctx2.sent == ["a", "b"] and not ctx2.ended


async def test_report_played_sends_growing_positions_until_the_end() -> None:
    ctx = FakeContext()
    heard = [0.0]
    task = asyncio.create_task(report_played(ctx, lambda: heard[0], every_s=0.01))  # type: ignore[arg-type]
    for ms in (0.0, 0.0, 100.0, 250.0):
        heard[0] = ms
        await asyncio.sleep(0.03)
    ctx._done.set()
    await asyncio.wait_for(task, 1)
    assert ctx.played_ms == [0.0, 100.0, 250.0]
