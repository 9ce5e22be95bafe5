"""OpenAI's speech API on rtserver: ``POST /v1/audio/speech`` and friends.

The request is OpenAI's (``model``, ``input``, ``voice``, ``response_format``
mp3/opus/aac/flac/wav/pcm, ``speed`` 0.25-4.0, ``stream_format`` audio|sse);
the body streams as the text is spoken: chunked audio, or Server-Sent Events
``speech.audio.delta`` (base64 audio) then ``speech.audio.done``. Every format
is made at 24 kHz mono (OpenAI's ``pcm`` is 24 kHz s16le). ``model`` is
accepted and not used: the voice decides the model.

Each request is one context of the speech core (``rtserver.core.speak``: this
endpoint is one more sink of the core, as the WebSocket connection is), so
the same voices, segmenter, pacing and metrics apply (``rtserver_contexts_total``,
``rtserver_ttfa_ms``, rtf, the running-context count); the PCM frames it yields
are tempo-changed for ``speed`` (unless the voice speaks at that speed
itself: its ``controls.speed_range``, e.g. Piper's length scale) and encoded
here (``rtserver.audio.encoders``).

Same limits, auth and admission as the WebSocket: ``max_text_chars``, the API
keys and tokens (``http.identify``), ``Gate.start`` and ``Gate.text`` per
request as for a context (draining, the voice's breaker, the per-key context
and character rates, the predicted first heard audio), and at most
``max_contexts`` requests of one client at once (the WebSocket's limit per
connection). Errors are OpenAI's error JSON with the status of
``HTTP_STATUS`` (the one map from rtserver's error codes).

A finished phrase goes to the phrase cache (``rtserver.cache``); a repeat of
the same voice, text, format and speed answers from memory at once.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import numpy as np

from rtserver.audio.encoders import CONTENT_TYPES, FORMATS, Tempo, make_encoder
from rtserver.audio.pcm import FloatArray
from rtserver.cache import CachedPhrase, PhraseCache, PhraseKey
from rtserver.core import AudioFrames, speak
from rtserver.errors import (
    BadMessage,
    ErrorCode,
    RtError,
    TextTooLong,
    TooManyContexts,
    UnknownVoice,
    UnsupportedFormat,
)
from rtserver.protocol.messages import Done, ErrorMessage, Start
from rtserver.server.asgi import BodyTooLarge, HttpStream, Receive, Send, read_body, send_response
from rtserver.server.gate import reject_reason
from rtserver.server.http import (
    HttpRequest,
    HttpResponse,
    authorized,
    identify,
    json_response,
)
from rtserver.server.state import AppState
from rtserver.text.segmenter import Segmenter

log = logging.getLogger("rtserver.openai")
_ids = itertools.count()

SPEECH_PATH = "/v1/audio/speech"
VOICES_PATH = "/v1/audio/voices"
MODELS_PATH = "/v1/models"
OPENAI_RATE = 24000  # OpenAI's pcm format: 24 kHz, 16-bit, mono
FRAME_MS = 20  # the core's frames for this endpoint: the smallest step to the first byte
# Model names OpenAI clients send; all are served by the requested voice.
MODELS = ("rtserver", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# JSON overhead of a request besides its text (field names, model, voice, ...)
BODY_SLACK_BYTES = 16384

# rtserver's error codes -> HTTP status: the one place this mapping lives.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_MESSAGE: 400,
    ErrorCode.UNSUPPORTED_FORMAT: 400,
    ErrorCode.UNKNOWN_CONTEXT: 400,
    ErrorCode.DUPLICATE_CONTEXT: 400,
    ErrorCode.TOO_MANY_CONTEXTS: 429,
    ErrorCode.UNKNOWN_VOICE: 404,
    ErrorCode.TEXT_TOO_LONG: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.ENGINE_FAILED: 503,
    ErrorCode.INTERNAL: 500,
}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error"}


def openai_error(status: int, message: str, code: str, param: str | None = None,
                 retry_after_ms: int | None = None) -> HttpResponse:
    """OpenAI's error body; ``Retry-After`` (whole seconds, rounded up) when known."""
    headers: tuple[tuple[str, str], ...] = ()
    if retry_after_ms is not None:
        headers = (("retry-after", str(max(1, math.ceil(retry_after_ms / 1000)))),)
    return json_response(status, {"error": {
        "message": message, "type": _ERROR_TYPES.get(status, "server_error"),
        "param": param, "code": code}}, headers)


def error_response(err: RtError, param: str | None = None) -> HttpResponse:
    return openai_error(HTTP_STATUS.get(err.code, 500), err.message, err.code.value, param,
                        err.retry_after_ms)


class _BadField(BadMessage):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    input: str
    voice: str  # the full voice name
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    model: str = "rtserver"
    # the voice speaks at ``speed`` itself (its ``controls.speed_range``
    # holds it): no tempo change afterwards
    native_speed: bool = False

    def cache_key(self) -> PhraseKey:
        # every field that changes the audio; stream_format only wraps it
        return PhraseKey.of(self.voice, self.input, self.response_format, OPENAI_RATE,
                            speed=self.speed)


def parse_speech_request(body: bytes, app: AppState) -> SpeechRequest:
    """Check a request body; raises the ``RtError`` that answers it."""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadField("", f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _BadField("", "the body must be a JSON object")

    def field(name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = obj.get(name, default)
        if value is None and default is None:
            raise _BadField(name, f"'{name}' is required")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _BadField(name, f"'{name}' has the wrong type")
        return value

    text = field("input", str)
    if not text.strip():
        raise _BadField("input", "'input' is empty")
    limit = app.config.server.max_text_chars
    if len(text) > limit:
        err = TextTooLong(f"'input' has {len(text)} characters; the limit is {limit}")
        raise err
    requested = field("voice", str, "default")
    voice = app.voice_aliases.get(requested, requested)
    if voice not in app.voices:
        raise UnknownVoice(f"unknown voice '{requested}'; GET {VOICES_PATH} lists them")
    fmt = field("response_format", str, "mp3")
    if fmt not in FORMATS:
        raise UnsupportedFormat(f"response_format '{fmt}' is not one of {', '.join(FORMATS)}")
    speed = float(field("speed", (int, float), 1.0))
    if not 0.25 <= speed <= 4.0:
        raise _BadField("speed", f"speed {speed} is outside 0.25..4.0")
    stream_format = field("stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise _BadField("stream_format", "stream_format must be 'audio' or 'sse'")
    model = field("model", str, "rtserver")
    span = app.voices[voice].info.controls.speed_range
    native = speed != 1.0 and span is not None and span[0] <= speed <= span[1]
    return SpeechRequest(input=text, voice=voice, response_format=fmt, speed=speed,
                         stream_format=stream_format, model=model, native_speed=native)


def sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class SpeechApi:
    """The handlers; ``handlers()`` gives them to ``RtAsgi`` by (method, path)."""

    def __init__(self, app: AppState, cache: PhraseCache) -> None:
        self.app = app
        self.cache = cache
        self.clock = app.clock  # the server's one clock
        # requests being spoken per client (API key, else address): at most
        # ``max_contexts``, the WebSocket's limit per connection
        self._open: dict[str, int] = {}
        self._responses = 0  # responses not yet ended (a drain waits for them)

    @property
    def in_flight(self) -> int:
        """Speech responses being sent now (a drain waits for them)."""
        return self._responses

    def _release(self, who: str) -> None:
        self._open[who] -= 1
        if not self._open[who]:
            del self._open[who]

    def handlers(self) -> dict[tuple[str, str], Any]:
        return {("POST", SPEECH_PATH): self.speech, ("GET", VOICES_PATH): self.voices,
                ("GET", MODELS_PATH): self.models}

    def _refusal(self, request: HttpRequest) -> HttpResponse | None:
        if not authorized(self.app, request):
            self.app.metrics.rejected.labels("unauthorized").inc()
            return openai_error(HTTPStatus.UNAUTHORIZED, "missing or wrong API key",
                                "invalid_api_key")
        return None

    def _admit(self, who: str, speech: SpeechRequest) -> None:
        """The WebSocket's admission for a new context (``Gate.start``: draining,
        the voice's breaker, the per-key context rate, the predicted first heard
        audio), then its character rate; raises the refusal."""
        now = self.clock.now()
        gate = self.app.gate
        start = speech_start(speech, "http")
        gate.start(who, speech.voice, now, "http",
                   lambda: self.app.core.predicted_first_heard_ms(start))
        gate.text(who, len(speech.input), now, "http")

    async def voices(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        refusal = self._refusal(request)
        if refusal is None:
            voices = self.app.voices_json()
            refusal = json_response(HTTPStatus.OK, {
                "voices": [v["name"] for v in voices], "default": self.app.default_voice,
                "data": voices})
        await send_response(send, refusal)

    async def models(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        refusal = self._refusal(request)
        if refusal is None:
            refusal = json_response(HTTPStatus.OK, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "rtserver"}
                for m in MODELS]})
        await send_response(send, refusal)

    async def speech(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        refusal = self._refusal(request)
        if refusal is not None:
            await send_response(send, refusal)
            return
        limit = self.app.config.server.max_text_chars * 4 + BODY_SLACK_BYTES  # UTF-8: <= 4 B
        try:
            body = await read_body(receive, limit)
            speech = parse_speech_request(body, self.app)
            who = identify(self.app, request).key
            if self._open.get(who, 0) >= self.app.config.server.max_contexts:
                raise TooManyContexts(
                    f"{self.app.config.server.max_contexts} requests of this client are being "
                    "spoken; wait for one to finish", retry_after_ms=1000)
            self._admit(who, speech)
        except ConnectionError:
            return
        except BodyTooLarge as exc:
            self.app.metrics.errors.labels(ErrorCode.TEXT_TOO_LONG.value).inc()
            await send_response(send, openai_error(413, str(exc), "text_too_long", "input"))
            return
        except RtError as exc:
            self.app.metrics.errors.labels(exc.code.value).inc()
            if exc.code in (ErrorCode.RATE_LIMITED, ErrorCode.OVERLOADED,
                            ErrorCode.ENGINE_FAILED):
                self.app.metrics.rejected.labels(reject_reason(exc)).inc()
            await send_response(send, error_response(exc, getattr(exc, "param", None)))
            return
        self._open[who] = self._open.get(who, 0) + 1
        self._responses += 1
        held = True

        def release() -> None:
            """Free the client's slot (once): called before the body's end, so
            a client that has read the whole answer may ask again at once."""
            nonlocal held
            if held:
                held = False
                self._release(who)

        try:
            await self._stream(speech, receive, send, release)
        finally:
            release()
            self._responses -= 1

    async def _stream(self, speech: SpeechRequest, receive: Receive, send: Send,
                      release: Callable[[], None]) -> None:
        now = self.clock.now()
        segmenter = Segmenter(self.app.config.segmenter)
        segments = segmenter.feed(speech.input, now) + segmenter.end(now)
        if not segments:
            err = _BadField("input", "'input' has nothing to speak")
            self.app.metrics.errors.labels(err.code.value).inc()
            await send_response(send, error_response(err, "input"))
            return
        out = HttpStream(receive, send)
        sse = speech.stream_format == "sse"
        ctype = "text/event-stream" if sse else CONTENT_TYPES[speech.response_format]
        await out.start(200, [("content-type", ctype), ("cache-control", "no-store"),
                              ("x-accel-buffering", "no")])

        async def write(data: bytes) -> None:
            if not data:
                return
            if sse:
                await out.write(sse_event({"type": "speech.audio.delta",
                                           "audio": base64.b64encode(data).decode()}))
            else:
                await out.write(data)

        async def body() -> float:
            key = speech.cache_key()
            cached = self.cache.get(key)
            if cached is not None:
                for chunk in cached.chunks:
                    await write(chunk)
                return cached.audio_ms
            chunks: list[bytes] | None = [] if self.cache.enabled else None
            audio_ms, chunks = await self._synthesize(speech, write, chunks)
            if chunks is not None:  # all of it was kept: small enough to cache
                self.cache.put(key, CachedPhrase(tuple(chunks), audio_ms))
            return audio_ms

        work = asyncio.create_task(body(), name="speech")
        watcher = asyncio.create_task(out.watch(), name="speech-disconnect")
        try:
            await asyncio.wait([work, watcher], return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client went away: stop speaking at once
                work.cancel()
                await asyncio.wait([work])
                return
            audio_ms = work.result()
            if sse:
                chars = len(speech.input)
                await out.write(sse_event({"type": "speech.audio.done", "usage": {
                    "input_tokens": chars, "output_tokens": 0, "total_tokens": chars}}))
            release()  # before the end: the client sees it only once the slot is free
            await out.end()
            self.app.metrics.audio_seconds.labels(speech.voice).inc(audio_ms / 1000.0)
        except ConnectionError:
            pass  # the client went away
        except RtError as err:
            self.app.metrics.errors.labels(err.code.value).inc()
            log.warning("speech failed: %s (%s)", err.message, err.code.value)
            if not sse:
                raise  # the body stops short: uvicorn drops the connection
            # the status is sent; SSE can still say why
            await _quietly(out.write(sse_event({"type": "error", "error": {
                "message": err.message, "code": err.code.value}})))
            await _quietly(out.end())
        finally:
            for task in (work, watcher):
                task.cancel()
            await asyncio.wait([work, watcher])

    async def _synthesize(self, speech: SpeechRequest,
                          write: Callable[[bytes], Awaitable[None]], keep: list[bytes] | None
                          ) -> tuple[float, list[bytes] | None]:
        """Speak ``speech.input`` as one context of the speech core (24 kHz
        PCM frames), each piece tempo-changed when ``speed`` != 1, encoded and
        written. ``keep`` collects what was written, for the cache, up to one
        entry's limit. Returns the audio's ms and ``keep`` (None when it
        outgrew the limit). The core counts the context (outcome, TTFA, rtf)."""
        encoder = make_encoder(speech.response_format, OPENAI_RATE)
        tempo = (Tempo(OPENAI_RATE, speech.speed)
                 if speech.speed != 1.0 and not speech.native_speed else None)
        keep_limit = self.cache.max_entry_bytes  # beyond this it cannot be cached anyway
        kept = 0

        async def emit(pcm: FloatArray, last: bool = False) -> None:
            nonlocal kept, keep
            if tempo is not None:
                pcm = tempo.push(pcm)
                if last:
                    pcm = np.concatenate([pcm, tempo.flush()])
            data = encoder.push(pcm) + (encoder.finish() if last else b"")
            if data and keep is not None:
                kept += len(data)
                if kept > keep_limit:
                    keep = None  # too long to cache: stop holding a copy
                else:
                    keep.append(data)
            await write(data)

        start = speech_start(speech, f"http-{next(_ids)}")
        audio_ms = 0.0
        async with speak(self.app.core, start) as ctx:
            ctx.feed(speech.input)
            ctx.end()
            async for event in ctx.events():
                if isinstance(event, AudioFrames):
                    pcm = np.frombuffer(b"".join(event.frames), "<i2")
                    await emit(pcm.astype(np.float32) / 32768.0)
                elif isinstance(event, ErrorMessage):
                    raise error_of(event)
                elif isinstance(event, Done):
                    audio_ms = event.audio_ms
        await emit(np.zeros(0, np.float32), last=True)
        return (audio_ms if speech.native_speed else audio_ms / speech.speed), keep


def speech_start(speech: SpeechRequest, context: str) -> Start:
    """The core context of a request: 24 kHz PCM frames, encoded here."""
    return Start(context=context, voice=speech.voice, format="pcm_s16le",
                 sample_rate=OPENAI_RATE, frame_ms=FRAME_MS,
                 speed=speech.speed if speech.native_speed else None)


def error_of(message: ErrorMessage) -> RtError:
    """The ``RtError`` of an ``error`` the core reported for a context."""
    err = RtError(message.message, retry_after_ms=message.retry_after_ms)
    try:
        err.code = ErrorCode(message.code)
    except ValueError:
        err.code = ErrorCode.INTERNAL
    return err


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except (OSError, ConnectionError):
        pass
