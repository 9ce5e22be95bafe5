"""rtserver as a LiveKit Agents TTS plugin.

``TTS`` keeps one WebSocket to rtserver (through ``rtserver.client``) shared by
its streams; each ``stream()`` (one agent turn) is one rtserver context: the
pushed text goes in as it comes, ``flush()`` sends ``flush``, ``end_input()``
sends ``end``, and closing the stream early (an interruption) sends
``cancel``. Audio is 16-bit PCM asked of the server at the plugin's rate and
reaches the agent as ``rtc.AudioFrame``; each spoken segment's words become
``TimedString``s with start and end times (the server reports where each
segment starts; the next one, or the end, says where it stops; the words are
placed within it by character position).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from livekit.agents import APIConnectionError, APIStatusError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions, TimedString

from rtserver.client import (
    AudioFrames,
    ContextStream,
    RtClient,
    RtClientError,
    ServerError,
    word_times,
)
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, SegmentStarted

# PROTOCOL.md, `start`: the PCM rates the server frames at
SERVER_RATES = (8000, 12000, 16000, 24000, 48000)
_turns = itertools.count(1)


class TTS(tts.TTS):
    """``url``: the server's ``ws://HOST:PORT/v1/stream``; ``token``: its API
    key if it has keys; ``voice``: a name from ``GET /v1/voices`` (None: the
    server's default); ``sample_rate``: one of ``SERVER_RATES``."""

    def __init__(self, *, url: str, token: str | None = None, voice: str | None = None,
                 sample_rate: int = 24000) -> None:
        if sample_rate not in SERVER_RATES:
            raise ValueError(f"sample_rate must be one of {SERVER_RATES}, not {sample_rate}")
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True,
                                                           aligned_transcript=True),
                         sample_rate=sample_rate, num_channels=1)
        self._url = url
        self._token = token
        self._voice = voice
        self._client: RtClient | None = None
        self._lock = asyncio.Lock()

    @property
    def model(self) -> str:
        return self._voice or "default"

    @property
    def provider(self) -> str:
        return "rtserver"

    async def connection(self) -> RtClient:
        """The shared connection, opened (again) when needed."""
        async with self._lock:
            if self._client is None or self._client.closed:
                self._client = await RtClient.connect(self._url, self._token)
            return self._client

    def prewarm(self) -> None:
        asyncio.get_running_loop().create_task(self.connection())

    def synthesize(self, text: str, *,
                   conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
                   ) -> tts.ChunkedStream:
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
               ) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None


class SynthesizeStream(tts.SynthesizeStream):
    """One agent turn: one rtserver context."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._rt = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        try:
            client = await self._rt.connection()
            ctx = await client.start(f"lk-{next(_turns)}", voice=self._rt._voice,
                                     format="pcm_s16le", sample_rate=self._rt.sample_rate)
        except ServerError as exc:
            raise APIStatusError(str(exc), status_code=400, retryable=False) from exc
        except (RtClientError, OSError) as exc:
            raise APIConnectionError(f"rtserver: {exc}") from exc
        output_emitter.initialize(request_id=ctx.context, sample_rate=ctx.sample_rate,
                                  num_channels=1, mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=ctx.context)
        sender = asyncio.create_task(self._send(ctx), name=f"rtserver-send:{ctx.context}")
        try:
            await self._receive(ctx, output_emitter)
            await sender
        finally:
            await utils.aio.cancel_and_wait(sender)
            if not ctx.finished:  # interrupted (the stream was closed) or failed
                with contextlib.suppress(Exception):
                    await asyncio.shield(ctx.cancel(reply_timeout_s=2.0))

    async def _send(self, ctx: ContextStream) -> None:
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                await ctx.flush()
            else:
                self._mark_started()
                await ctx.send_text(data)
        await ctx.end()

    async def _receive(self, ctx: ContextStream, out: tts.AudioEmitter) -> None:
        pending: tuple[str, float] | None = None  # the segment whose end is not known yet
        frame_s = ctx.frame_ms / 1000.0
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                out.push(b"".join(event.frames))
            elif isinstance(event, SegmentStarted):
                start_s = event.seq * frame_s
                _words(out, pending, start_s)
                # `source`: offsets into the text sent, which is the text pushed
                a, b = event.source
                pending = (self._pushed_text[a:b], start_s)
            elif isinstance(event, Done):
                _words(out, pending, event.audio_ms / 1000.0)
                out.end_segment()
                return
            elif isinstance(event, ErrorMessage):
                raise APIStatusError(f"rtserver {event.code}: {event.message}",
                                     status_code=500, retryable=False)
            elif isinstance(event, Cancelled):
                return


def _words(out: tts.AudioEmitter, segment: tuple[str, float] | None, end_s: float) -> None:
    """A segment's words as ``TimedString``s, once its end is known."""
    if segment is None:
        return
    text, start_s = segment
    words = word_times(text, start_s, max(start_s, end_s))
    for i, (word, at) in enumerate(words):
        until = words[i + 1][1] if i + 1 < len(words) else max(start_s, end_s)
        out.push_timed_transcript(TimedString(word + " ", start_time=at, end_time=until))


__all__ = ["SERVER_RATES", "TTS", "SynthesizeStream"]
