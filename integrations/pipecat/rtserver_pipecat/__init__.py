"""rtserver as a Pipecat TTS service.

``RtserverTTSService`` keeps one WebSocket to rtserver (through
``rtserver.client``) and opens one rtserver context per Pipecat turn: the
turn's text goes in as it comes (tokens or sentences), ``flush_audio`` at the
end of the turn sends ``end``, and an interruption sends ``cancel``. Audio
arrives as ``TTSAudioRawFrame`` (16-bit PCM asked of the server at the
pipeline's rate), and each spoken segment's words become Pipecat word
timestamps: the server says when a segment starts (its first frame's seq);
the words of a segment are placed within it by character position once the
next segment (or the end) says where it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.tts_service import TextAggregationMode, TTSService

from rtserver.client import AudioFrames, ContextStream, RtClient, RtClientError, word_times
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, SegmentStarted

# PROTOCOL.md, `start`: the PCM rates the server frames at
SERVER_RATES = (8000, 12000, 16000, 24000, 48000)
MAX_CONTEXT_CHARS = 64  # PROTOCOL.md: a context name is 1-64 characters


@dataclass
class _Turn:
    ctx: ContextStream
    text: list[str] = field(default_factory=list)  # what the turn sent, in order
    reader: asyncio.Task[None] | None = None
    pending: tuple[str, float] | None = None  # the segment whose end is not known yet


class RtserverTTSService(TTSService):
    """Streams each turn's text to rtserver over one WebSocket.

    ``url`` is the server's ``ws://HOST:PORT/v1/stream``; ``token`` its API key
    if it has keys; ``voice`` a name from ``GET /v1/voices`` (None: the
    server's default).
    """

    def __init__(self, *, url: str, token: str | None = None, voice: str | None = None,
                 sample_rate: int | None = None,
                 text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
                 **kwargs: Any) -> None:
        # TOKEN: rtserver segments the text itself (its segmenter is made for
        # LLM tokens), so the turn's tokens go straight through.
        super().__init__(text_aggregation_mode=text_aggregation_mode, push_text_frames=False,
                         push_start_frame=True, sample_rate=sample_rate, **kwargs)
        self._url = url
        self._token = token
        self._voice = voice
        self._client: RtClient | None = None
        self._turns: dict[str, _Turn] = {}
        self._connect_lock = asyncio.Lock()

    def can_generate_metrics(self) -> bool:
        return True

    async def _connection(self) -> RtClient:
        async with self._connect_lock:
            if self._client is None or self._client.closed:
                self._client = await RtClient.connect(self._url, self._token)
            return self._client

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        for context_id in list(self._turns):
            await self._drop(context_id, cancel=False)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None

    # --- one turn = one rtserver context ------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        try:
            turn = self._turns.get(context_id)
            if turn is None:
                turn = await self._open(context_id)
            turn.text.append(text)
            await turn.ctx.send_text(text)
            await self.start_tts_usage_metrics(text)
        except (RtClientError, OSError) as exc:
            yield ErrorFrame(error=f"rtserver: {exc}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None  # the audio arrives through the turn's reader

    async def _open(self, context_id: str) -> _Turn:
        client = await self._connection()
        rate = self.sample_rate if self.sample_rate in SERVER_RATES else 48000
        ctx = await client.start(context_id[:MAX_CONTEXT_CHARS], voice=self._voice,
                                 format="pcm_s16le", sample_rate=rate)
        turn = _Turn(ctx)
        self._turns[context_id] = turn
        turn.reader = self.create_task(self._read(context_id, turn), f"rtserver:{context_id}")
        return turn

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: rtserver speaks the rest, then `done`."""
        turn = self._turns.get(context_id or self.get_active_audio_context_id() or "")
        if turn is not None and not turn.ctx.finished:
            with contextlib.suppress(RtClientError):
                await turn.ctx.end()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: `cancel` the turn's context (its `cancelled` fences the audio)."""
        await self.stop_all_metrics()
        await self._drop(context_id, cancel=True)
        await super().on_audio_context_interrupted(context_id)

    async def _drop(self, context_id: str, *, cancel: bool) -> None:
        turn = self._turns.pop(context_id, None)
        if turn is None:
            return
        if turn.reader is not None:
            await self.cancel_task(turn.reader)
        if cancel and not turn.ctx.finished:
            with contextlib.suppress(RtClientError, TimeoutError):
                await turn.ctx.cancel(reply_timeout_s=2.0)

    async def _read(self, context_id: str, turn: _Turn) -> None:
        ctx = turn.ctx
        resampler = create_stream_resampler()
        frame_s = ctx.frame_ms / 1000.0
        first = True
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                if first:
                    await self.stop_ttfb_metrics()
                    first = False
                audio = b"".join(event.frames)
                if ctx.sample_rate != self.sample_rate:
                    audio = await resampler.resample(audio, ctx.sample_rate, self.sample_rate)
                await self.append_to_audio_context(context_id, TTSAudioRawFrame(
                    audio=audio, sample_rate=self.sample_rate, num_channels=1,
                    context_id=context_id))
            elif isinstance(event, SegmentStarted):
                await self._segment_words(context_id, turn, event.seq * frame_s,
                                          "".join(turn.text)[event.source[0]:event.source[1]])
            elif isinstance(event, Done):
                await self._segment_words(context_id, turn, event.audio_ms / 1000.0, None)
                await self.append_to_audio_context(context_id,
                                                   TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)
            elif isinstance(event, ErrorMessage):
                logger.warning(f"{self}: rtserver error {event.code}: {event.message}")
                await self.push_error(error_msg=f"rtserver {event.code}: {event.message}")
            elif isinstance(event, Cancelled):
                break
        self._turns.pop(context_id, None)

    async def _segment_words(self, context_id: str, turn: _Turn, at_s: float,
                             text: str | None) -> None:
        """Word timestamps of the previous segment, now that its end (``at_s``) is known."""
        if turn.pending is not None:
            prev_text, prev_start = turn.pending
            words = word_times(prev_text, prev_start, max(prev_start, at_s))
            if words:
                await self.add_word_timestamps(words, context_id)
        turn.pending = None if text is None else (text, at_s)


__all__ = ["RtserverTTSService", "word_times"]
