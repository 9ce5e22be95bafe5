"""One WebSocket connection: a reader, a writer and the contexts, all in one
task group. The protocol decisions are the sans-I/O ``Session``'s, the
speech is the core's (``rtserver.core``: each context writes into this
connection's ``Outbox``, its sink); this shell carries out the session's
actions and moves bytes through a ``WsTransport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from websockets.exceptions import ConnectionClosed

from rtserver.core import AudioFrames, Finished, SpeechContext
from rtserver.errors import CloseCode, Overloaded, RtError
from rtserver.protocol.messages import ErrorMessage, ServerMessage, Started, encode_server_message
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
from rtserver.server.outbox import ControlItem, Outbox
from rtserver.server.state import AppState
from rtserver.server.transport import WsTransport

log = logging.getLogger("rtserver.connection")

MAX_FRAMES_PER_MESSAGE = 50  # 1 s of 20 ms frames: bounded message size, few syscalls


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
        self.live: dict[str, SpeechContext] = {}
        self._tasks: set[asyncio.Task[None]] = set()
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
                for task in self._tasks:
                    task.cancel()
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
        except* (ConnectionClosed, ConnectionError):
            pass
        finally:
            self.outbox.close()
            metrics.connections.dec()
            for ctx in self.live.values():
                ctx.release()
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
            self.live[action.context].feed(action.text)
        elif isinstance(action, FlushContext):
            self.live[action.context].flush()
        elif isinstance(action, EndContext):
            self.live[action.context].end()
        elif isinstance(action, CancelContext):
            await self._cancel(action.context)
        elif isinstance(action, ListenerProgress):
            ctx = self.live.get(action.context)
            if ctx is not None:
                ctx.heard_ms = action.audio_ms
        elif isinstance(action, CloseConnection):
            raise _Closing(action)

    def _reply(self, message: ServerMessage, context: str | None = None) -> None:
        if isinstance(message, ErrorMessage):
            self.app.metrics.errors.labels(message.code).inc()
        self.outbox.put_control(message, context)

    def _open(self, action: OpenContext) -> None:
        start = action.start
        try:
            ctx = self.app.core.open(start, self.outbox, stream=action.stream,
                                     voice=action.voice)
        except RtError as err:  # the session checked the options; the core agrees
            self.session.context_finished(start.context, -1)
            self._reply(error_message(err))
            return
        self.outbox.put_control(Started(
            context=start.context, stream=action.stream, format=start.format,
            sample_rate=start.sample_rate, frame_ms=start.frame_ms,
            pre_skip=ctx.framer.pre_skip, voice=ctx.voice.info.name), start.context)
        self.live[start.context] = ctx
        assert self._group is not None
        task = self._group.create_task(self._run_context(ctx), name=f"ctx:{start.context}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_context(self, ctx: SpeechContext) -> None:
        if await ctx.run() == "failed":
            self._finished(ctx.context)

    async def _cancel(self, context: str) -> None:
        ctx = self.live.get(context)
        if ctx is None:
            return
        await ctx.cancel()
        self._finished(context)

    def _finished(self, context: str) -> None:
        """The context is over (done sent, failed or cancelled): free its name."""
        ctx = self.live.pop(context, None)
        if ctx is not None:
            self.session.context_finished(context, ctx.ledger.last_sent_seq)

    # --- writing ---------------------------------------------------------------

    async def _writer(self) -> None:
        overload_s = self.app.config.server.overload_after_s
        metrics = self.app.metrics
        outbox = self.outbox
        send = self.ws.send
        while True:
            item = await outbox.get_batch(MAX_FRAMES_PER_MESSAGE)
            data: str | bytes
            if isinstance(item, AudioFrames):
                ledger = item.ledger
                if ledger.fenced:
                    continue
                data = encode_audio_message(ledger.stream, item.seq, item.frames,
                                            last=item.last, segment_start=item.segment_start)
                ledger.delivered(item.seq + len(item.frames) - 1)
                metrics.audio_seconds.labels(ledger.voice).inc(item.audio_ms / 1000.0)
                metrics.queue_ms.observe(outbox.queued_ms)
            elif isinstance(item, ControlItem):
                data = encode_server_message(item.message)
            else:
                assert isinstance(item, Finished)
                data = encode_server_message(item.done())
                self._finished(item.context)
            try:
                async with asyncio.timeout(overload_s):
                    await send(data)
            except TimeoutError:
                raise Overloaded(
                    f"the client read nothing for {overload_s:g} s; closing") from None


class _Closing(Exception):
    """Raised inside the task group to close the connection with a code."""


__all__ = ["Connection"]
