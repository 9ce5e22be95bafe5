"""One WebSocket connection: a reader, a writer and the contexts, all in one
task group. The protocol decisions are the sans-I/O ``Session``'s, the
speech is the core's (``rtserver.core``: each context writes into this
connection's ``Outbox``, its sink); this shell carries out the session's
actions and moves bytes through a ``WsTransport``.

Limits (docs/DESIGN.md, "Limits and failure modes"): the input was budgeted
before it was parsed (``ws_protocol``: a flood is cut off there); the reader
takes at most ``messages_per_s`` messages a second (a sustained flood closes
1008) and
yields to the loop after each one, so one connection's input cannot starve the
others; replies waiting to be sent are capped (``max_queued_messages``, 1008);
an idle connection closes after ``idle_timeout_s``; each ``start`` and
``text`` passes the server's ``Gate`` (draining, breakers, per-key rates, the
first-heard target). A peer that leaves ends the connection quietly; any
other failure is logged and closes it 1011.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

import msgspec
from websockets.exceptions import ConnectionClosed

from rtserver.core import AudioFrames, Finished, SpeechContext
from rtserver.core.heard import FirstHeard
from rtserver.errors import (
    CloseCode,
    ControlFlood,
    InternalError,
    Overloaded,
    RateLimited,
    RtError,
)
from rtserver.logs import current_request_id, new_request_id, request_scope
from rtserver.metrics import REJECT_REASONS
from rtserver.protocol.messages import (
    Cancelled,
    Done,
    ErrorMessage,
    Ready,
    ServerMessage,
    Started,
    encode_server_message,
)
from rtserver.protocol.session import (
    RECENTLY_FINISHED,
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
from rtserver.server.gate import MessagePace, reject_reason
from rtserver.server.guards import Unauthorized
from rtserver.server.http import identify
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
        # finished contexts whose listener has not reported hearing them yet
        self._heard: OrderedDict[str, FirstHeard] = OrderedDict()
        self.key = client_key(ws, app)  # whose rate limits this connection counts against
        self._pace = MessagePace(cfg, app.clock.now())
        self._tasks: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None
        # request ids (docs/PROTOCOL-EXTENSIONS.md): the connection's is its
        # handshake's (rtserver.server.request_ids); each context has its own,
        # the client's ``start.request_id`` or "<connection's>-<n>"
        self.request_id = current_request_id() or new_request_id()
        self._rids: dict[str, str] = {}
        # finished contexts' ids, for the replies a late cancel still gets
        self._recent_rids: OrderedDict[str, str] = OrderedDict()
        self._opened = 0
        self.outbox.stamp = self._stamp

    async def run(self) -> None:
        """Serve until the client leaves, the server drains, or a fatal error."""
        metrics = self.app.metrics
        metrics.connections.inc()
        self.outbox.put_control(self.app.ready_message())
        close: CloseConnection | None = None
        last: RtError | None = None  # the error sent just before the close frame
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                writer = group.create_task(self._writer(), name="writer")
                await self._reader()
                writer.cancel()
                for task in self._tasks:
                    task.cancel()
        except* (Overloaded, ControlFlood) as eg:
            err = eg.exceptions[0]
            assert isinstance(err, RtError) and err.close_code is not None
            metrics.errors.labels(err.code.value).inc()
            if isinstance(err, ControlFlood) and self.ws.claim_rejection():
                metrics.rejected.labels("control_flood").inc()
            close = CloseConnection(err.close_code, err.message[:120])
            last = err
        except* _Closing as eg:
            close = eg.exceptions[0].args[0]
        except* ConnectionClosed:
            pass  # the peer left: nobody to tell
        except* Exception as eg:  # our bug: say so, log it, and close 1011
            log.error("connection failed", exc_info=eg.exceptions[0])
            metrics.errors.labels("internal").inc()
            close = CloseConnection(CloseCode.INTERNAL, "internal error")
            last = InternalError("internal error")
        finally:
            self.outbox.close()
            metrics.connections.dec()
            for ctx in self.live.values():
                ctx.release()
            self.live.clear()
        if close is not None:
            # the error goes out right before the close frame, behind the frames
            # already sent (the queue is dropped): a client that reads again in
            # time gets both; one that never does is cut off by the transport
            await self.ws.close(close.code, close.reason,
                                last=None if last is None else
                                encode_server_message(error_message(last)))

    # --- reading ---------------------------------------------------------------

    async def _reader(self) -> None:
        idle_s = self.app.config.server.idle_timeout_s
        pace = self._pace
        while True:
            try:
                if idle_s > 0 and not self.live:
                    async with asyncio.timeout(idle_s):
                        data = await self.ws.recv()
                else:
                    data = await self.ws.recv()
            except ConnectionClosed:
                return
            except TimeoutError:
                raise _Closing(CloseConnection(CloseCode.NORMAL, "idle")) from None
            # the client's message rate: past it, this reader waits (and TCP
            # pushes back on the client); a sustained flood raises ControlFlood
            wait = pace.wait_s(self.app.clock.now())
            if wait > 0:  # one wait is enough: the bucket holds a token after it
                await asyncio.sleep(wait)
                pace.wait_s(self.app.clock.now())
            actions = (self.session.receive_text(data) if isinstance(data, str)
                       else self.session.receive_binary(data))
            for action in actions:
                await self._do(action)
            await asyncio.sleep(0)  # a fair share: other connections and our writer run

    async def _do(self, action: object) -> None:
        if isinstance(action, Reply):
            self._reply(action.message)
        elif isinstance(action, OpenContext):
            self._open(action)
        elif isinstance(action, FeedText):
            self._feed(action)
        elif isinstance(action, FlushContext):
            self.live[action.context].flush()
        elif isinstance(action, EndContext):
            self.live[action.context].end()
        elif isinstance(action, CancelContext):
            await self._cancel(action.context)
        elif isinstance(action, ListenerProgress):
            self._played(action)
        elif isinstance(action, CloseConnection):
            raise _Closing(action)

    def _reply(self, message: ServerMessage, context: str | None = None) -> None:
        """A reply to the client's own message. Replies it has not read count
        against ``max_queued_messages``: past it, it floods (1008)."""
        if self.outbox.control_count >= self.app.config.server.max_queued_messages:
            raise ControlFlood("the client sends faster than it reads its replies; closing")
        if isinstance(message, ErrorMessage):
            self.app.metrics.errors.labels(message.code).inc()
        self.outbox.put_control(message, context)

    def _refuse(self, err: RtError) -> None:
        reason = reject_reason(err)
        if reason in REJECT_REASONS:
            self.app.metrics.rejected.labels(reason).inc()
        self._reply(error_message(err))

    def _feed(self, action: FeedText) -> None:
        try:
            self.app.gate.text(self.key, len(action.text), self.app.clock.now(), action.context)
        except RateLimited as err:
            self.session.refund(action.context, len(action.text))
            self._refuse(err)
            return
        self.live[action.context].feed(action.text)

    def _open(self, action: OpenContext) -> None:
        start = action.start
        self._opened += 1
        rid = start.request_id or f"{self.request_id}-{self._opened}"
        try:
            self.app.gate.start(self.key, action.voice, self.app.clock.now(), start.context,
                                lambda: self.app.core.admission_first_heard_ms(
                                    start, action.voice))
        except RtError as err:  # refused: it was never open
            self.session.forget(start.context)
            err.request_id = err.request_id or rid
            self._refuse(err)
            return
        with request_scope(rid):  # the context's tasks log with its id
            try:
                ctx = self.app.core.open(start, self.outbox, stream=action.stream,
                                         voice=action.voice)
            except RtError as err:  # the session checked the options; the core agrees
                self.session.forget(start.context)
                err.request_id = err.request_id or rid
                self._reply(error_message(err))
                return
            self._rids[start.context] = rid
            self._recent_rids.pop(start.context, None)
            self.outbox.put_control(Started(
                context=start.context, stream=action.stream, format=start.format,
                sample_rate=start.sample_rate, frame_ms=start.frame_ms,
                pre_skip=ctx.framer.pre_skip, voice=ctx.voice.info.name), start.context)
            self.live[start.context] = ctx
            assert self._group is not None
            task = self._group.create_task(self._run_context(ctx),
                                           name=f"ctx:{start.context}")
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
            rid = self._rids.pop(context, None)
            if rid is not None:
                self._recent_rids[context] = rid
                while len(self._recent_rids) > RECENTLY_FINISHED:
                    self._recent_rids.popitem(last=False)
            self.session.context_finished(context, ctx.ledger.last_sent_seq)
            if ctx.first_heard.waiting:  # its listener's first `played` is still to come
                self._heard[context] = ctx.first_heard
                while len(self._heard) > RECENTLY_FINISHED:
                    self._heard.popitem(last=False)

    def _played(self, action: ListenerProgress) -> None:
        """A listener's report: the first of each context measures first heard audio."""
        ctx = self.live.get(action.context)
        if ctx is not None:
            ctx.played(action.audio_ms)
            return
        heard = self._heard.pop(action.context, None)
        if heard is not None:
            heard.played(action.audio_ms, self.app.clock.now())

    def _stamp(self, message: ServerMessage, context: str | None) -> ServerMessage:
        """``message`` with its request id: its context's, else the connection's
        (``ready``, and errors that are about no open context)."""
        if not isinstance(message, _CARRY_ID) or message.request_id is not None:
            return message
        name = context if context is not None else getattr(message, "context", None)
        rid = (self._rids.get(name) or self._recent_rids.get(name) if name is not None
               else None) or self.request_id
        return msgspec.structs.replace(message, request_id=rid)

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
                metrics.send_queue_seconds.observe(outbox.queued_ms / 1000.0)
            elif isinstance(item, ControlItem):
                data = _encode(item.message, item.context)
            else:
                assert isinstance(item, Finished)
                # its summary is logged as ``done`` is made: with the context's id
                with request_scope(self._rids.get(item.context) or self.request_id):
                    done = item.done()
                data = _encode(self._stamp(done, item.context), item.context)
                self._finished(item.context)
            try:
                async with asyncio.timeout(overload_s):
                    await send(data)
            except TimeoutError:
                raise Overloaded(
                    f"the client read nothing for {overload_s:g} s; closing") from None


def client_key(ws: WsTransport, app: AppState) -> str:
    """The key this connection's rate limits count against: its API key's id
    (or the key that minted its token), else its address. The handshake
    already checked the credential (``http.admit_websocket``)."""
    request = getattr(ws, "request", None)
    if request is None:
        return "unknown"
    try:
        return identify(app, request).key
    except Unauthorized:  # not reached: the handshake refused it
        return "unknown"


def _encode(message: ServerMessage, context: str | None) -> str:
    """The JSON text of ``message``; should it not encode (our bug), an
    ``internal`` error for its context instead: the writer never dies of it."""
    try:
        return encode_server_message(message)
    except (TypeError, ValueError) as exc:
        log.error("could not encode %s: %s", type(message).__name__, exc)
        return encode_server_message(error_message(InternalError("internal error",
                                                                 context=context)))


# the messages that carry a request id
_CARRY_ID = (Ready, Started, Done, Cancelled, ErrorMessage)


class _Closing(Exception):
    """Raised inside the task group to close the connection with a code."""


__all__ = ["Connection"]
