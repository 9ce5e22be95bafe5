"""OpenAI's speech API on rtserver: ``POST /v1/audio/speech`` and friends.

The request is OpenAI's (``model``, ``input``, ``voice``, ``instructions``,
``response_format`` mp3/opus/aac/flac/wav/pcm, ``speed`` 0.25-4.0,
``stream_format`` audio|sse), validated by a pydantic model (``SpeechBody``,
which ``/openapi.json`` and ``/docs`` show); the body streams as the text is
spoken: chunked audio, or Server-Sent Events ``speech.audio.delta`` (base64
audio) then ``speech.audio.done`` with ``usage``, as OpenAI sends them. Every
format is made at 24 kHz mono (OpenAI's ``pcm`` is 24 kHz s16le). ``model`` is
accepted and not used: the voice decides the model.

- ``voice``: one of OpenAI's names (``alloy``, ...: each maps to a configured
  voice, ``[openai] voices``; by default the server's default voice), a voice
  object ``{"id": ...}`` (its id is looked up the same way), or an rtserver
  voice name or alias.
- ``instructions``: no rtserver voice follows free-text instructions (Piper
  has no style input; Orpheus' tags and ChatTTS' control tokens go inside the
  text and are not instructions), so a request with them is refused, 400 with param
  ``instructions``, unless ``[openai] ignore_instructions`` is set: then it is
  spoken without them and the response says so (``x-rtserver-ignored:
  instructions``).
- A failure after the status was sent: the audio body stops short (the
  client sees a broken chunked body); an SSE stream ends with one event that
  carries OpenAI's error object, ``data: {"error": {...}}``, without a
  ``type`` of its own: the form OpenAI's streams use and its client raises
  ``APIError`` for.

Each request is one context of the speech core (``rtserver.core.speak``: this
endpoint is one more sink of the core, as the WebSocket connection is), so
the same voices, segmenter, pacing and metrics apply (``rtserver_contexts_total``,
``rtserver_ttfa_seconds``, rtf, the running-context count); the PCM frames it yields
are tempo-changed for ``speed`` (unless the voice speaks at that speed
itself: its ``controls.speed_range``, e.g. Piper's length scale) and encoded
here (``rtserver.audio.encoders``).

Same limits, auth and admission as the WebSocket: ``max_text_chars``, the API
keys and tokens (``http.identify``), ``Gate.start`` and ``Gate.text`` per
request as for a context (draining, the voice's breaker, the per-key context
and character rates, the predicted first heard audio), and at most
``admission.http_requests_per_key`` requests of one client at once
(``Gate.http``; a backend's one key may use a whole server). Errors are
OpenAI's error JSON (``{"error": {"message", "type", "param", "code"}}``) with
the status of ``HTTP_STATUS`` (the one map from rtserver's error codes); 429
and 503 carry ``Retry-After`` (seconds) and ``retry-after-ms``, the headers
OpenAI's clients read.

A finished phrase goes to the phrase cache (``rtserver.cache``); a repeat of
the same voice, text, format and speed answers from memory at once.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from rtserver.audio.encoders import CONTENT_TYPES, Tempo, make_encoder
from rtserver.audio.pcm import FloatArray
from rtserver.cache import CachedPhrase, PhraseCache, PhraseKey
from rtserver.config import OPENAI_VOICES
from rtserver.core import AudioFrames, speak
from rtserver.errors import (
    BadMessage,
    ConfigError,
    ErrorCode,
    RtError,
    TextTooLong,
    UnknownVoice,
)
from rtserver.protocol.messages import Done, ErrorMessage, Start
from rtserver.server.asgi import (
    HttpStream,
    RawResponse,
    Receive,
    Send,
    request_of,
    send_response,
)
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
MODELS = ("rtserver", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
# JSON overhead of a request besides its text (field names, model, voice, ...)
BODY_SLACK_BYTES = 16384
Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]

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
# OpenAI's error types by status (its API reference, "Error codes")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "invalid_request_error",
                405: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error"}


def error_body(status: int, message: str, code: str | None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def openai_error(status: int, message: str, code: str | None, param: str | None = None,
                 retry_after_ms: int | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    """OpenAI's error body; on 429 and 503 ``Retry-After`` (whole seconds,
    rounded up) and ``retry-after-ms`` (OpenAI's clients read both)."""
    if retry_after_ms is None and status in (429, 503):
        retry_after_ms = 1000
    if retry_after_ms is not None:
        headers = (*headers, ("retry-after", str(max(1, math.ceil(retry_after_ms / 1000)))),
                   ("retry-after-ms", str(max(0, int(retry_after_ms)))))
    return json_response(status, error_body(status, message, code, param), headers)


class ApiError(Exception):
    """An rtserver error as the HTTP API answers it, with the request field
    it is about (OpenAI's ``param``)."""

    def __init__(self, err: RtError, param: str | None = None) -> None:
        super().__init__(err.message)
        self.err = err
        self.param = param

    def response(self) -> HttpResponse:
        return error_response(self.err, self.param)


def error_response(err: RtError, param: str | None = None) -> HttpResponse:
    return openai_error(HTTP_STATUS.get(err.code, 500), err.message, err.code.value, param,
                        err.retry_after_ms)


class VoiceObject(BaseModel):
    """A voice by id (OpenAI's custom voice reference)."""

    id: str = Field(description="a name mapped in `[openai] voices`, or an rtserver voice")


class SpeechBody(BaseModel):
    """OpenAI's ``POST /audio/speech`` body."""

    model_config = ConfigDict(extra="ignore")  # fields OpenAI adds later are not errors

    input: str = Field(description="the text to speak")
    model: str = Field("rtserver", description="accepted, not used: the voice decides")
    voice: str | VoiceObject = Field(
        "default", description=f"one of OpenAI's names ({', '.join(OPENAI_VOICES)}; "
        "mapped by `[openai] voices`), an rtserver voice (`GET /v1/audio/voices`) or "
        "`{\"id\": ...}`")
    instructions: str | None = Field(
        None, description="no rtserver voice follows them: 400 unless "
        "`[openai] ignore_instructions`")
    response_format: Format = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0, strict=True)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    input: str
    voice: str  # the full voice name
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    model: str = "rtserver"
    ignored: tuple[str, ...] = ()  # request fields accepted and not used
    request_id: str | None = None  # the request-id middleware's (rtserver.server.request_ids)
    # the voice speaks at ``speed`` itself (its ``controls.speed_range``
    # holds it): no tempo change afterwards
    native_speed: bool = False

    def cache_key(self) -> PhraseKey:
        # every field that changes the audio; stream_format only wraps it
        return PhraseKey.of(self.voice, self.input, self.response_format, OPENAI_RATE,
                            speed=self.speed)


def speech_request(body: SpeechBody, app: AppState, voice_map: dict[str, str],
                   ignore_instructions: bool) -> SpeechRequest:
    """The request a valid body asks for; raises the ``ApiError`` that answers it."""
    text = body.input
    if not text.strip():
        raise ApiError(BadMessage("'input' is empty"), "input")
    limit = app.config.server.max_text_chars
    if len(text) > limit:
        raise ApiError(TextTooLong(f"'input' has {len(text)} characters; the limit is "
                                   f"{limit}"), "input")
    requested = body.voice.id if isinstance(body.voice, VoiceObject) else body.voice
    voice = resolve_voice(requested, app, voice_map)
    if voice is None:
        raise ApiError(UnknownVoice(f"unknown voice '{requested}'; GET {VOICES_PATH} lists "
                                    "them"), "voice")
    ignored: tuple[str, ...] = ()
    if body.instructions and body.instructions.strip():
        if not ignore_instructions:
            raise ApiError(BadMessage(
                "'instructions' cannot be followed: no rtserver voice takes free-text "
                "instructions (set [openai] ignore_instructions to speak without them)"),
                "instructions")
        ignored = ("instructions",)
    span = app.voices[voice].info.controls.speed_range
    native = body.speed != 1.0 and span is not None and span[0] <= body.speed <= span[1]
    return SpeechRequest(input=text, voice=voice, response_format=body.response_format,
                         speed=body.speed, stream_format=body.stream_format,
                         model=body.model, ignored=ignored, native_speed=native)


def resolve_voice(requested: str, app: AppState, voice_map: dict[str, str]) -> str | None:
    """An rtserver voice's full name: ``requested`` through the OpenAI voice
    map, then the server's aliases (``default``, short names); None if unknown."""
    name = voice_map.get(requested, requested)
    voice = app.voice_aliases.get(name, name)
    return voice if voice in app.voices else None


def sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class ApiAuthError(Exception):
    """The request carries no valid API key or token (401)."""


class SpeechApi:
    """The OpenAI endpoints; ``router()`` gives them to the HTTP app."""

    def __init__(self, app: AppState, cache: PhraseCache) -> None:
        self.app = app
        self.cache = cache
        self.clock = app.clock  # the server's one clock
        self.voice_map = app.config.openai.voice_map()
        for name, voice in self.voice_map.items():
            if resolve_voice(voice, app, {}) is None:
                raise ConfigError(f"openai.voices: '{name}={voice}' names a voice this "
                                  f"server does not load ({', '.join(app.voices)})")
        self._responses = 0  # responses not yet ended (a drain waits for them)

    @property
    def in_flight(self) -> int:
        """Speech responses being sent now (a drain waits for them)."""
        return self._responses

    @property
    def body_limit(self) -> int:
        """Bytes a speech request's body may have (UTF-8: <= 4 B a character)."""
        return self.app.config.server.max_text_chars * 4 + BODY_SLACK_BYTES

    def router(self) -> APIRouter:
        router = APIRouter(tags=["OpenAI speech"], dependencies=[Depends(self._authorize)],
                           responses={401: {"description": "missing or wrong API key"}})
        router.add_api_route(SPEECH_PATH, self.speech, methods=["POST"],
                             summary="Speak text (OpenAI's create speech)",
                             response_class=Response, responses={200: {
                                 "description": "the audio, streamed as it is spoken, or "
                                 "Server-Sent Events with stream_format sse",
                                 "content": {**{CONTENT_TYPES[f]: {} for f in CONTENT_TYPES},
                                             "text/event-stream": {}}}})
        router.add_api_route(VOICES_PATH, self.voices, methods=["GET"],
                             summary="The voices, and OpenAI's names mapped to them")
        router.add_api_route(MODELS_PATH, self.models, methods=["GET"],
                             summary="Model names OpenAI clients send (all accepted)")
        return router

    async def _authorize(self, request: Request) -> None:  # async: no thread hop
        if not authorized(self.app, request_of(request.scope)):
            self.app.metrics.rejected.labels("unauthorized").inc()
            raise ApiAuthError

    def _admit(self, who: str, speech: SpeechRequest) -> None:
        """The WebSocket's admission for a new context (``Gate.start``: draining,
        the voice's breaker, the per-key context rate, the predicted first heard
        audio), then its character rate; raises the refusal."""
        now = self.clock.now()
        gate = self.app.gate
        start = speech_start(speech, "http")
        gate.start(who, speech.voice, now, "http",
                   lambda: self.app.core.admission_first_heard_ms(start))
        gate.text(who, len(speech.input), now, "http")

    async def voices(self) -> dict[str, Any]:
        """rtserver's voices (``data``: as ``GET /v1/voices`` lists them) and the
        voice each OpenAI name speaks with (``openai``)."""
        voices = self.app.voices_json()
        mapped = {name: resolve_voice(voice, self.app, {})
                  for name, voice in self.voice_map.items()}
        return {"voices": [v["name"] for v in voices], "default": self.app.default_voice,
                "data": voices, "openai": mapped}

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "rtserver"}
            for m in MODELS]}

    async def speech(self, body: SpeechBody, request: Request) -> Response:
        http = request_of(request.scope)
        speech = speech_request(body, self.app, self.voice_map,
                                self.app.config.openai.ignore_instructions)
        rid = request.scope.get("state", {}).get("request_id")
        if isinstance(rid, str):
            speech = dataclasses.replace(speech, request_id=rid)
        return RawResponse(lambda receive, send: self._respond(http, speech, receive, send))

    async def _respond(self, request: HttpRequest, speech: SpeechRequest, receive: Receive,
                       send: Send) -> None:
        try:
            who = identify(self.app, request).key
            self.app.gate.http.acquire(who, "speech requests")
            try:
                self._admit(who, speech)
            except BaseException:
                self.app.gate.http.release(who)
                raise
        except RtError as exc:
            self.app.metrics.errors.labels(exc.code.value).inc()
            if exc.code in (ErrorCode.RATE_LIMITED, ErrorCode.OVERLOADED,
                            ErrorCode.ENGINE_FAILED):
                self.app.metrics.rejected.labels(reject_reason(exc)).inc()
            await send_response(send, error_response(exc))
            return
        self._responses += 1
        held = True

        def release() -> None:
            """Free the client's slot (once): called before the body's end, so
            a client that has read the whole answer may ask again at once."""
            nonlocal held
            if held:
                held = False
                self.app.gate.http.release(who)

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
            err = BadMessage("'input' has nothing to speak")
            self.app.metrics.errors.labels(err.code.value).inc()
            await send_response(send, error_response(err, "input"))
            return
        out = HttpStream(receive, send)
        sse = speech.stream_format == "sse"
        ctype = "text/event-stream" if sse else CONTENT_TYPES[speech.response_format]
        headers = [("content-type", ctype), ("cache-control", "no-store"),
                   ("x-accel-buffering", "no")]
        if speech.ignored:
            headers.append(("x-rtserver-ignored", ", ".join(speech.ignored)))
        await out.start(200, headers)

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
            # the status is sent; SSE can still say why, as OpenAI's streams do:
            # one last event that is the error object (no event type of its own)
            event = error_body(HTTP_STATUS.get(err.code, 500), err.message, err.code.value)
            if speech.request_id is not None:  # as the middleware marks JSON error bodies
                event["error"]["request_id"] = event["request_id"] = speech.request_id
            await _quietly(out.write(sse_event(event)))
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
        failure: RtError | None = None
        async with speak(self.app.core, start) as ctx:
            ctx.feed(speech.input)
            ctx.end()
            async for event in ctx.events():
                if isinstance(event, AudioFrames):
                    pcm = np.frombuffer(b"".join(event.frames), "<i2")
                    await emit(pcm.astype(np.float32) / 32768.0)
                elif isinstance(event, ErrorMessage):
                    failure = error_of(event)  # the last event; raised outside the
                    # context's task group, which would wrap it in an ExceptionGroup
                elif isinstance(event, Done):
                    audio_ms = event.audio_ms
        if failure is not None:
            raise failure
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
