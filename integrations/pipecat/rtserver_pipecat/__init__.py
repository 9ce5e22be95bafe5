"""rtserver as a Pipecat TTS service.

``RtserverTTSService`` is a ``WebsocketTTSService``, as Pipecat's own
WebSocket TTS services are: it opens its WebSocket to rtserver when the
pipeline starts (``StartFrame``), reads it in Pipecat's receive loop, and when
the connection drops, Pipecat's reconnect logic (backoff, quick-failure
detection, ``on_connection_error``) opens a new one; the turns that were
speaking on the lost connection end (rtserver keeps no context across
connections) and the next turn speaks on the new one.

Each Pipecat turn is one rtserver context: the turn's text goes in as it
comes (tokens or sentences), ``flush_audio`` at the end of the turn sends
``end``, and an interruption sends ``cancel``. Audio arrives as
``TTSAudioRawFrame`` (16-bit PCM asked of the server at the pipeline's rate),
and each spoken segment's words become Pipecat word timestamps: the server
says when a segment starts (its first frame's seq); the words of a segment are
placed within it by character position once the next segment (or the end)
says where it stops.

The protocol's messages are read and written by ``rtserver.protocol`` (the
types the server itself encodes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from websockets.protocol import State

from rtserver.client import TERMINAL_ERROR_CODES, word_times
from rtserver.errors import UnknownMessageType
from rtserver.protocol.messages import (
    MAX_CONTEXT_ID_CHARS,
    SAMPLE_RATES,
    Cancel,
    ClientMessage,
    Done,
    End,
    ErrorMessage,
    Ready,
    SegmentStarted,
    Start,
    Started,
    Text,
    encode_client_message,
    parse_server_message,
)
from rtserver.protocol.wire import decode_audio_message

__version__ = "0.1.0"

# PROTOCOL.md, `start`: the PCM rates the server frames at
SERVER_RATES = SAMPLE_RATES
# server messages are small; 16 MiB leaves room for a large `ready`
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass
class _Turn:
    """One Pipecat turn: one rtserver context on the current connection."""

    context_id: str  # Pipecat's
    name: str  # rtserver's context name
    rate: int  # the rate asked of the server
    text: list[str] = field(default_factory=list)  # what the turn sent, in order
    stream: int | None = None  # from `started`
    frame_s: float = 0.02
    first_audio: bool = True
    ended: bool = False  # `end` sent
    pending: tuple[str, float] | None = None  # the segment whose end is not known yet


class RtserverTTSService(WebsocketTTSService):
    """Streams each turn's text to rtserver over one persistent WebSocket.

    ``url`` is the server's ``ws://HOST:PORT/v1/stream``; ``token`` its API key
    if it has keys; ``voice`` a name from ``GET /v1/voices`` (None: the
    server's default); ``open_timeout`` bounds the handshake and the wait for
    the server's ``ready``. Other keyword arguments go to Pipecat's
    ``WebsocketTTSService`` (``reconnect_on_error``,
    ``reconnect_backoff_min_wait``, ...).
    """

    def __init__(self, *, url: str, token: str | None = None, voice: str | None = None,
                 sample_rate: int | None = None, open_timeout: float = 10.0,
                 text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
                 **kwargs: Any) -> None:
        # TOKEN: rtserver segments the text itself (its segmenter is made for
        # LLM tokens), so the turn's tokens go straight through.
        super().__init__(text_aggregation_mode=text_aggregation_mode, push_text_frames=False,
                         push_start_frame=True, sample_rate=sample_rate, **kwargs)
        self._url = url
        self._token = token
        self._voice = voice
        self._open_timeout = open_timeout
        self._receive_task: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._turns: dict[str, _Turn] = {}  # by Pipecat context id
        self._names: dict[str, _Turn] = {}  # by rtserver context name
        self._streams: dict[int, _Turn] = {}  # by rtserver stream (binary frames)
        self._resampler = create_stream_resampler()
        self.ready: Ready | None = None  # the server's `ready` on the current connection

    def can_generate_metrics(self) -> bool:
        return True

    # --- the connection: opened at pipeline start, reopened by Pipecat on a drop ---

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        try:
            await self._connect_websocket()
        except ConnectionError as exc:  # reported; the next turn tries again
            await self.push_error(error_msg=str(exc), exception=exc)
            return
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None and self._websocket.state is State.OPEN:
            return
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            ws = await self._websocket_connect(
                self._url, additional_headers=headers, compression=None,
                max_size=MAX_MESSAGE_BYTES, open_timeout=self._open_timeout, proxy=None)
            try:
                async with asyncio.timeout(self._open_timeout):  # not wait_for: cpython#86296
                    first = await ws.recv()
                ready = parse_server_message(first)
                if not isinstance(ready, Ready):
                    raise ConnectionError(f"the first message is '{ready.type}', not 'ready'")
            except BaseException:
                await ws.close()
                raise
        except Exception as exc:  # OSError, a timeout, a refused handshake (InvalidStatus)
            self._websocket = None
            await self._call_event_handler("on_connection_error", f"rtserver: {exc}")
            raise ConnectionError(f"rtserver at {self._url}: {exc}") from exc
        self._websocket = ws
        self.ready = ready
        logger.debug(f"{self}: connected to {ready.server} at {self._url}")
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        ws, self._websocket = self._websocket, None
        self._forget_turns()
        if ws is not None:
            await self.stop_all_metrics()
            await ws.close()
            await self._call_event_handler("on_disconnected")

    async def _close_connection_contexts(self) -> None:
        # the connection is being replaced: its contexts are gone with it
        self._forget_turns()
        await super()._close_connection_contexts()

    def _forget_turns(self) -> None:
        self._turns.clear()
        self._names.clear()
        self._streams.clear()

    async def _send(self, message: ClientMessage) -> None:
        ws = self._websocket
        if ws is None:
            raise ConnectionError("not connected to rtserver")
        async with self._send_lock:
            await ws.send(encode_client_message(message))

    # --- one turn = one rtserver context -------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        try:
            if self._websocket is None or self._websocket.state is not State.OPEN:
                await self._connect()
                if self._websocket is None:
                    raise ConnectionError(f"no connection to rtserver at {self._url}")
            turn = self._turns.get(context_id)
            if turn is None:
                turn = await self._open(context_id)
            turn.text.append(text)
            await self._send(Text(context=turn.name, text=text))
            await self.start_tts_usage_metrics(text)
        except (ConnectionError, OSError) as exc:
            yield ErrorFrame(error=f"rtserver: {exc}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None  # the audio arrives through the receive loop

    async def _open(self, context_id: str) -> _Turn:
        rate = self.sample_rate if self.sample_rate in SERVER_RATES else 48000
        name = context_id[:MAX_CONTEXT_ID_CHARS]
        turn = _Turn(context_id, name, rate)
        self._turns[context_id] = turn
        self._names[name] = turn
        # `text` may follow `start` at once: the server reads a connection in order
        await self._send(Start(context=name, voice=self._voice, format="pcm_s16le",
                               sample_rate=rate))
        return turn

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: rtserver speaks the rest, then `done`."""
        turn = self._turns.get(context_id or self.get_active_audio_context_id() or "")
        if turn is not None and not turn.ended:
            turn.ended = True
            try:
                await self._send(End(context=turn.name))
            except (ConnectionError, OSError) as exc:  # the receive loop reconnects
                logger.warning(f"{self}: end of turn not sent: {exc}")

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: `cancel` the turn's context; its later frames are dropped here."""
        await self.stop_all_metrics()
        turn = self._drop(context_id)
        if turn is not None:
            try:
                await self._send(Cancel(context=turn.name))
            except (ConnectionError, OSError) as exc:
                logger.warning(f"{self}: cancel not sent: {exc}")
        await super().on_audio_context_interrupted(context_id)

    def _drop(self, context_id: str) -> _Turn | None:
        turn = self._turns.pop(context_id, None)
        if turn is not None:
            self._names.pop(turn.name, None)
            if turn.stream is not None:
                self._streams.pop(turn.stream, None)
        return turn

    # --- the receive loop ------------------------------------------------------------

    async def _receive_messages(self) -> None:
        ws = self._websocket
        if ws is None:
            raise ConnectionError("not connected to rtserver")
        async for data in ws:
            if isinstance(data, bytes):
                await self._on_audio(data)
            else:
                await self._on_text(data)

    async def _on_audio(self, data: bytes) -> None:
        msg = decode_audio_message(data)
        turn = self._streams.get(msg.stream)
        if turn is None or not self.audio_context_available(turn.context_id):
            return  # a cancelled turn's last frames
        if turn.first_audio:
            await self.stop_ttfb_metrics()
            turn.first_audio = False
        audio = b"".join(msg.frames)
        if turn.rate != self.sample_rate:
            audio = await self._resampler.resample(audio, turn.rate, self.sample_rate)
        await self.append_to_audio_context(turn.context_id, TTSAudioRawFrame(
            audio=audio, sample_rate=self.sample_rate, num_channels=1,
            context_id=turn.context_id))

    async def _on_text(self, data: str) -> None:
        try:
            message = parse_server_message(data)
        except UnknownMessageType:
            return  # PROTOCOL.md: the server may add message types
        name = getattr(message, "context", None)
        turn = self._names.get(name) if name is not None else None
        if isinstance(message, ErrorMessage):
            await self._on_error(message, turn)
            return
        if turn is None:
            return  # a finished or cancelled turn's late message
        if isinstance(message, Started):
            turn.stream = message.stream
            turn.frame_s = message.frame_ms / 1000.0
            self._streams[message.stream] = turn
        elif isinstance(message, SegmentStarted):
            await self._segment_words(turn, message.seq * turn.frame_s,
                                      "".join(turn.text)[message.source[0]:message.source[1]])
        elif isinstance(message, Done):
            await self._segment_words(turn, message.audio_ms / 1000.0, None)
            self._drop(turn.context_id)
            if self.audio_context_available(turn.context_id):
                await self.append_to_audio_context(turn.context_id,
                                                   TTSStoppedFrame(context_id=turn.context_id))
                await self.remove_audio_context(turn.context_id)

    async def _on_error(self, error: ErrorMessage, turn: _Turn | None) -> None:
        logger.warning(f"{self}: rtserver error {error.code}: {error.message}")
        await self.push_error(error_msg=f"rtserver {error.code}: {error.message}")
        # a refused `start` or an error that ends the context ends the turn
        if turn is not None and (turn.stream is None or error.code in TERMINAL_ERROR_CODES):
            self._drop(turn.context_id)
            if self.audio_context_available(turn.context_id):
                await self.append_to_audio_context(turn.context_id,
                                                   TTSStoppedFrame(context_id=turn.context_id))
                await self.remove_audio_context(turn.context_id)

    async def _segment_words(self, turn: _Turn, at_s: float, text: str | None) -> None:
        """Word timestamps of the previous segment, now that its end (``at_s``) is known."""
        if turn.pending is not None:
            prev_text, prev_start = turn.pending
            words = word_times(prev_text, prev_start, max(prev_start, at_s))
            if words:
                await self.add_word_timestamps(words, turn.context_id)
        turn.pending = None if text is None else (text, at_s)


__all__ = ["SERVER_RATES", "RtserverTTSService", "word_times"]
