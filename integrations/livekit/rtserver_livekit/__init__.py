"""rtserver as a LiveKit Agents TTS plugin.

``TTS`` keeps one WebSocket to rtserver (through ``rtserver.client``) shared by
its streams; each ``stream()`` (one agent turn) is one rtserver context: the
pushed text goes in as it comes, ``flush()`` sends ``flush``, ``end_input()``
sends ``end``, and closing the stream early (an interruption) sends
``cancel``.

The framework's ``conn_options`` hold: ``timeout`` bounds the connection's
handshake and the wait for ``started``; a failed attempt that may succeed
later (a lost connection, a timeout, ``rate_limited``, ``overloaded``, an
``engine_failed`` that says when to retry) raises a retryable error, and
LiveKit's stream tries again up to ``max_retry`` times (replaying the text),
``retry_interval`` apart but never before the server's ``retry_after_ms``.

Audio is 16-bit PCM asked of the server at the plugin's rate and reaches the
agent as ``rtc.AudioFrame``; each spoken segment's words become
``TimedString``s with start and end times (the server reports where each
segment starts; the next one, or the end, says where it stops; the words are
placed within it by character position).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from livekit.agents import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions, TimedString

from rtserver.client import (
    TERMINAL_ERROR_CODES,
    AudioFrames,
    ContextStream,
    HandshakeRejected,
    RtClient,
    RtClientError,
    ServerError,
    word_times,
)
from rtserver.protocol.messages import SAMPLE_RATES, Cancelled, Done, ErrorMessage, SegmentStarted

__version__ = "0.1.0"

# PROTOCOL.md, `start`: the PCM rates the server frames at
SERVER_RATES = SAMPLE_RATES
# rtserver's error codes as HTTP statuses (LiveKit's APIStatusError): 429 and 503
# are retryable, 4xx others are not (the request itself is wrong)
STATUS = {"rate_limited": 429, "overloaded": 503, "engine_failed": 503, "internal": 500,
          "unknown_voice": 404, "unsupported_format": 400, "bad_message": 400,
          "text_too_long": 413, "too_many_contexts": 429, "duplicate_context": 409,
          "unknown_context": 404}
# what may succeed later: the server says when (retry_after_ms)
RETRYABLE = frozenset({"rate_limited", "overloaded"})
_turns = itertools.count(1)


def api_error(error: ErrorMessage) -> APIStatusError:
    """An rtserver ``error`` as LiveKit's ``APIStatusError``: ``rate_limited`` and
    ``overloaded`` retryable (``engine_failed`` too when the server says when to
    retry: its breaker is open), the rest not; ``body`` is the message, which
    carries ``retry_after_ms``."""
    retryable = error.code in RETRYABLE or (error.code == "engine_failed"
                                            and error.retry_after_ms is not None)
    return APIStatusError(f"rtserver {error.code}: {error.message}",
                          status_code=STATUS.get(error.code, 500), body=error,
                          retryable=retryable)


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

    async def connection(self, open_timeout: float = DEFAULT_API_CONNECT_OPTIONS.timeout
                         ) -> RtClient:
        """The shared connection, opened (again) when needed; ``open_timeout``
        bounds the handshake and the wait for ``ready``."""
        async with self._lock:
            if self._client is None or self._client.closed:
                self._client = await RtClient.connect(self._url, self._token,
                                                      open_timeout=open_timeout)
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
        self._not_before = 0.0  # monotonic: the server's retry_after_ms of the last attempt

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        # a retry (LiveKit's loop calls _run again) waits out what the server asked
        wait = self._not_before - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await self._attempt(output_emitter)
        except APIStatusError as exc:
            body = exc.body
            if exc.retryable and isinstance(body, ErrorMessage) and body.retry_after_ms:
                self._not_before = time.monotonic() + body.retry_after_ms / 1000.0
            raise

    async def _attempt(self, output_emitter: tts.AudioEmitter) -> None:
        timeout = self._conn_options.timeout
        try:
            client = await self._rt.connection(timeout)
            ctx = await client.start(f"lk-{next(_turns)}", voice=self._rt._voice,
                                     format="pcm_s16le", sample_rate=self._rt.sample_rate,
                                     reply_timeout_s=timeout)
        except ServerError as exc:
            raise api_error(exc.error) from exc
        except HandshakeRejected as exc:
            raise APIStatusError(f"rtserver: {exc}", status_code=exc.status) from exc
        except TimeoutError as exc:
            raise APITimeoutError(f"rtserver did not answer within {timeout:g} s") from exc
        except (RtClientError, OSError) as exc:
            raise APIConnectionError(f"rtserver: {exc}") from exc
        output_emitter.initialize(request_id=ctx.context, sample_rate=ctx.sample_rate,
                                  num_channels=1, mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=ctx.context)
        sender = asyncio.create_task(self._send(ctx), name=f"rtserver-send:{ctx.context}")
        try:
            await self._receive(ctx, output_emitter)
            await sender
        except RtClientError as exc:  # the connection was lost (or broke the protocol)
            raise APIConnectionError(f"rtserver: {exc}") from exc
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
                # a refused text (rate_limited: over the characters a minute) or an
                # error that ends the context: the attempt fails (LiveKit retries it
                # while no audio was pushed); the context is cancelled in _attempt
                if event.code in RETRYABLE or event.code in TERMINAL_ERROR_CODES:
                    raise api_error(event)
                raise APIError(f"rtserver {event.code}: {event.message}", body=event,
                               retryable=False)
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


__all__ = ["SERVER_RATES", "TTS", "SynthesizeStream", "api_error"]
