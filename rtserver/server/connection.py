"""One WebSocket connection: a reader, a writer and the contexts' pipelines,
all in one task group. The protocol decisions are the sans-I/O ``Session``'s;
this shell carries out its actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from websockets.exceptions import ConnectionClosed

from rtserver.errors import CloseCode, EngineFailed, InternalError, Overloaded, RtError
from rtserver.pipeline import ContextPipeline
from rtserver.protocol.messages import (
    Cancelled,
    Done,
    ErrorMessage,
    ServerMessage,
    Started,
    encode_server_message,
)
from rtserver.protocol.session import (
    CancelContext,
    CloseConnection,
    EndContext,
    FeedText,
    FlushContext,
    ListenerProgress,
    OpenContext,
    Reply,
    Session,
    SessionLimits,
    error_message,
)
from rtserver.protocol.wire import encode_audio_message
from rtserver.server.outbox import AudioItem, ContextLedger, ControlItem, DeferredItem, Outbox
from rtserver.server.state import AppState
from rtserver.server.transport import WsTransport

log = logging.getLogger("rtserver.connection")

MAX_FRAMES_PER_MESSAGE = 50  # 1 s of 20 ms frames: bounded message size, few syscalls


@dataclass(slots=True)
class _Live:
    pipeline: ContextPipeline
    task: asyncio.Task[None]
    heard_ms: float = 0.0


class Connection:
    def __init__(self, ws: WsTransport, app: AppState) -> None:
        self.ws = ws
        self.app = app
        cfg = app.config.server
        self.session = Session(
            SessionLimits(max_text_chars=cfg.max_text_chars, max_contexts=cfg.max_contexts),
            voices=app.voices.keys(), default_voice=app.default_voice,
            voice_aliases=app.voice_aliases, families=app.families)
        self.outbox = Outbox(capacity_ms=cfg.send_queue_ms)
        self.live: dict[str, _Live] = {}
        self._group: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        """Serve until the client leaves, the server drains, or a fatal error."""
        metrics = self.app.metrics
        metrics.connections.inc()
        self.outbox.put_control(self.app.ready_message())
        close: CloseConnection | None = None
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                writer = group.create_task(self._writer(), name="writer")
                await self._reader()
                writer.cancel()
                for live in list(self.live.values()):
                    live.task.cancel()
        except* Overloaded as eg:
            err = eg.exceptions[0]
            assert isinstance(err, RtError)
            metrics.errors.labels(err.code.value).inc()
            close = CloseConnection(CloseCode.TRY_AGAIN_LATER, "overloaded")
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.ws.send(encode_server_message(error_message(err)))
        except* _Closing as eg:
            close = eg.exceptions[0].args[0]
        except* ConnectionClosed:
            pass
        finally:
            self.outbox.close()
            for live in self.live.values():
                live.task.cancel()
            metrics.connections.dec()
            self.app.load.active -= len(self.live)
            self.live.clear()
        if close is not None:
            await self.ws.close(close.code, close.reason)

    # --- reading ---------------------------------------------------------------

    async def _reader(self) -> None:
        while True:
            try:
                data = await self.ws.recv()
            except ConnectionClosed:
                return
            actions = (self.session.receive_text(data) if isinstance(data, str)
                       else self.session.receive_binary(data))
            for action in actions:
                await self._do(action)

    async def _do(self, action: object) -> None:
        if isinstance(action, Reply):
            self._reply(action.message)
        elif isinstance(action, OpenContext):
            self._open(action)
        elif isinstance(action, FeedText):
            self.live[action.context].pipeline.feed(action.text)
        elif isinstance(action, FlushContext):
            self.live[action.context].pipeline.flush()
        elif isinstance(action, EndContext):
            self.live[action.context].pipeline.end()
        elif isinstance(action, CancelContext):
            await self._cancel(action.context)
        elif isinstance(action, ListenerProgress):
            live = self.live.get(action.context)
            if live is not None:
                live.heard_ms = action.audio_ms
        elif isinstance(action, CloseConnection):
            raise _Closing(action)

    def _reply(self, message: ServerMessage, context: str | None = None) -> None:
        if isinstance(message, ErrorMessage):
            self.app.metrics.errors.labels(message.code).inc()
        self.outbox.put_control(message, context)

    def _open(self, action: OpenContext) -> None:
        start = action.start
        voice = self.app.voices[action.voice]
        ledger = ContextLedger(context=start.context, stream=action.stream,
                               frame_ms=start.frame_ms, voice=voice.info.name)
        cfg = self.app.config
        pipeline = ContextPipeline(
            context=start.context, start=start, voice=voice, ledger=ledger,
            outbox=self.outbox, voice_stats=self.app.voice_stats[action.voice],
            segmenter_config=cfg.segmenter, hint_config=cfg.hints, opus_config=cfg.opus,
            metrics=self.app.metrics, encode_pool=self.app.encode_pool)
        framer = pipeline.make_framer()
        self.outbox.put_control(Started(
            context=start.context, stream=action.stream, format=start.format,
            sample_rate=start.sample_rate, frame_ms=start.frame_ms,
            pre_skip=framer.pre_skip, voice=voice.info.name), start.context)
        assert self._group is not None
        task = self._group.create_task(self._run_context(pipeline), name=f"ctx:{start.context}")
        self.live[start.context] = _Live(pipeline, task)
        self.app.load.active += 1

    async def _run_context(self, pipeline: ContextPipeline) -> None:
        ctx = pipeline.context
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(pipeline.segment_loop())
                group.create_task(pipeline.speak_loop())
        except* RtError as eg:
            err = eg.exceptions[0]
            assert isinstance(err, RtError)
            err.context = ctx
            log.warning("context failed: %s (%s)", err.message, err.code.value)
            self._finish(ctx, "failed")
            self._reply(error_message(err), None)
        except* ConnectionError:
            pass  # the connection is closing; nothing more to say
        except* Exception as eg:
            log.exception("context crashed", exc_info=eg.exceptions[0])
            self._finish(ctx, "failed")
            self._reply(error_message(InternalError("internal error", context=ctx)))

    async def _cancel(self, ctx: str) -> None:
        live = self.live.get(ctx)
        if live is None:
            return
        live.task.cancel()
        await asyncio.wait([live.task])
        self.outbox.purge(ctx)
        ledger = live.pipeline.ledger
        ledger.fenced = True
        self._finish(ctx, "cancelled")
        self.outbox.put_control(Cancelled(context=ctx, last_seq=ledger.last_sent_seq),
                                urgent=True)

    def _finish(self, ctx: str, outcome: str) -> None:
        live = self.live.pop(ctx, None)
        if live is None:
            return
        pipe = live.pipeline
        self.session.context_finished(ctx, pipe.ledger.last_sent_seq)
        self.app.load.active -= 1
        metrics = self.app.metrics
        metrics.contexts_total.labels(outcome).inc()
        audio_ms = pipe.ledger.next_seq * pipe.start.frame_ms
        ttfa = pipe.ttfa_ms()
        if ttfa is not None and outcome == "done":
            metrics.ttfa_ms.labels(pipe.voice.info.name).observe(ttfa)
        log.info("context %s voice=%s chars=%d audio_ms=%d ttfa_ms=%s rtf=%.3f heard_ms=%.0f",
                 outcome, pipe.voice.info.name, pipe.chars_in, audio_ms,
                 "-" if ttfa is None else f"{ttfa:.1f}",
                 pipe.voice_stats.rtf.percentile(0.5), live.heard_ms)

    # --- writing ---------------------------------------------------------------

    async def _writer(self) -> None:
        overload_s = self.app.config.server.overload_after_s
        metrics = self.app.metrics
        while True:
            item = await self.outbox.get_batch(MAX_FRAMES_PER_MESSAGE)
            data: str | bytes
            if isinstance(item, AudioItem):
                ledger = item.ledger
                if ledger.fenced:
                    continue
                data = encode_audio_message(ledger.stream, item.seq, item.frames,
                                            last=item.last, segment_start=item.segment_start)
                ledger.last_sent_seq = item.seq + len(item.frames) - 1
                if ledger.first_sent_at is None:
                    ledger.first_sent_at = time.monotonic()
                metrics.audio_seconds.labels(ledger.voice).inc(item.audio_ms / 1000.0)
                metrics.queue_ms.observe(self.outbox.queued_ms)
            elif isinstance(item, ControlItem):
                data = encode_server_message(item.message)
            else:
                assert isinstance(item, DeferredItem)
                message = item.build()
                if isinstance(message, Done):
                    self._finish(item.context, "done")
                data = encode_server_message(message)
            try:
                async with asyncio.timeout(overload_s):
                    await self.ws.send(data)
            except TimeoutError:
                raise Overloaded(
                    f"the client read nothing for {overload_s:g} s; closing") from None


class _Closing(Exception):
    """Raised inside the task group to close the connection with a code."""


__all__ = ["Connection", "EngineFailed"]
