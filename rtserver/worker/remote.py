"""A front end's side of the GPU worker: ``WorkerLink`` and ``RemoteVoice``.

``WorkerLink`` is one DEALER socket to one GPU worker, a reader task that
routes each request's chunks to its own bounded buffer, and a heartbeat task.
``RemoteVoice`` is a worker's voice seen through the link: it implements the
``Voice`` protocol, so the speech core, pacing and Opus are unchanged.

- Start: ``await link.start()`` says ``Hello`` until the worker answers
  ``Ready`` (its voices and capacity); the server listens only then.
- The worker lost (its socket disconnects, or no ``Load`` answers a ``Ping``
  within ``timeout_s``): every open request fails with ``EngineLost``
  (``engine_failed``), ``down()`` says why (``/ready`` 503) and new contexts
  are refused, while the link keeps saying ``Hello``; a ``Ready`` from the
  restarted worker (a new epoch) brings the voices back. Connections stay.
- A consumer that leaves a request's audio untaken past
  ``request_buffer_s`` fails that request with ``overloaded`` and cancels it
  in the worker: the reader never waits, so the worker never does either.
- Stopping a ``synthesize`` early (cancel, ``aclose``) sends ``Cancel``.
- Starts elsewhere: the worker's ``Load`` says how many contexts' first
  segments wait there for their first output, and how many of them are this
  front end's; ``RemoteVoice.starting_elsewhere`` (the other front ends'
  part) is what the server adds to this process's own starting contexts for
  a first ``buffer`` hint and a predicted first heard audio
  (``core.stats.ServerLoad.starting_ahead``).
- Voices made at run time (LoRA adapters, ``POST /v1/admin/voices``): a
  ``RemoteMaker`` per family the worker makes voices for asks it
  (``MakeVoice`` / ``DropVoice``); the worker tells every front end its new
  voice list (``Voices``), which ``on_voices`` hands to the server, so a voice
  made through one front end is served by all of them. A restarted worker's
  ``Ready`` does the same (voices made at run time are gone with it).

Times cross the boundary as CLOCK_MONOTONIC seconds, translated from and to
the request's clock here (they are the same clock in production).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from zmq.utils.monitor import parse_monitor_message

from rtserver.audio.pcm import PcmChunk
from rtserver.config import Config, GpuConfig
from rtserver.errors import (
    Busy,
    ConfigError,
    EngineFailed,
    EngineLost,
    EngineUnavailable,
    ErrorCode,
    Overloaded,
    RtError,
    UnknownVoice,
)
from rtserver.logs import current_request_id
from rtserver.voices.base import MODEL_OUTPUT_MARK, SynthesisRequest, Voice, VoiceInfo
from rtserver.voices.registry import VoiceSet, load_voices
from rtserver.worker import messages as m
from rtserver.worker.metrics import load_families
from rtserver.worker.placement import split_specs
from rtserver.worker.sockets import sent_now

log = logging.getLogger("rtserver.worker")

# Wait before a new context is tried while the worker is down: about what a
# supervisor's first restart back-off is (rtserver/server/workers.py, 1 s).
DOWN_RETRY_MS = 1000
# Wait after the worker refused a new context for its capacity: a segment of
# a running context takes about this long on a GPU.
FULL_RETRY_MS = 250
CHUNK_DELAY_BUCKETS_S = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                         0.05, 0.1, 0.5)
# While a front end waits for its worker at start, it says so this often (s).
WAIT_SAY_S = 30.0
_ERRORS: dict[str, type[RtError]] = {ErrorCode.OVERLOADED.value: Busy,
                                     ErrorCode.UNKNOWN_VOICE.value: UnknownVoice}


class _End:
    """The request is complete."""


_END = _End()


class _Stream:
    """One request's chunks, in order, as the reader puts them."""

    __slots__ = ("buffered_s", "finished", "items", "wake")

    def __init__(self) -> None:
        self.items: collections.deque[PcmChunk | float | _End | RtError] = collections.deque()
        self.wake = asyncio.Event()
        self.buffered_s = 0.0
        self.finished = False  # End or a failure arrived: nothing to cancel

    def put(self, item: PcmChunk | float | _End | RtError) -> None:
        if isinstance(item, PcmChunk):
            self.buffered_s += item.duration_s
        elif not isinstance(item, float):
            self.finished = True
        self.items.append(item)
        self.wake.set()

    async def get(self) -> PcmChunk | float | _End | RtError:
        while not self.items:
            self.wake.clear()
            await self.wake.wait()
        item = self.items.popleft()
        if isinstance(item, PcmChunk):
            self.buffered_s -= item.duration_s
        return item


class WorkerLink:
    """One front end's link to one GPU worker at ``endpoint``."""

    def __init__(self, endpoint: str, config: GpuConfig) -> None:
        self.endpoint = endpoint
        self.config = config
        self.ready: m.Ready | None = None  # the worker's last Ready
        self.load: m.Load | None = None
        self.up = False
        self.why_down = "no GPU worker yet"
        self._streams: dict[str, _Stream] = {}
        self._seen = 0.0  # when the worker last answered
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        # Not ZMQ_IMMEDIATE: it ends the pipe at a disconnect, dropping what
        # the worker sent last and this side has not read yet (a dying
        # engine's Failed). Nothing queues while the worker is away all the
        # same: ``_send`` refuses until the monitor has seen the connection.
        self._connected = False
        self._sock.setsockopt(zmq.LINGER, 0)
        # a restarted worker is found within a quarter second of its bind
        self._sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 250)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED
                                                      | zmq.EVENT_DISCONNECTED)
        self._sock.connect(endpoint)
        self._tasks: list[asyncio.Task[None]] = []
        self._first_ready = asyncio.Event()
        # told (voices before, voices now) when the worker's voices change
        self.on_voices: Callable[[tuple[m.VoiceEntry, ...], tuple[m.VoiceEntry, ...]],
                                 None] | None = None
        self._calls: dict[str, asyncio.Future[None]] = {}  # MakeVoice / DropVoice by id
        self._call_ids = 0
        # from the worker's send to this reader: the seam's own delay, which
        # grows when this process's event loop falls behind
        self.chunk_delay_seconds = Histogram(
            "rtserver_gpu_worker_chunk_delay_seconds",
            "Time from the GPU worker's send of a chunk to this front end's read, seconds",
            buckets=CHUNK_DELAY_BUCKETS_S, registry=None)

    # -- life --------------------------------------------------------------------
    async def start(self, say: Callable[[str], None] = lambda msg: None) -> m.Ready:
        """Start the reader and the heartbeat; return the worker's first ``Ready``."""
        self._tasks = [asyncio.create_task(self._read(), name="gpu worker reader"),
                       asyncio.create_task(self._beat(), name="gpu worker heartbeat"),
                       asyncio.create_task(self._watch(), name="gpu worker monitor")]
        say(f"waiting for the GPU worker on {self.endpoint}")
        waited = 0.0
        while not self._first_ready.is_set():
            try:
                async with asyncio.timeout(WAIT_SAY_S):  # not wait_for: cpython#86296
                    await self._first_ready.wait()
            except TimeoutError:  # loading a model takes minutes; say we are here
                waited += WAIT_SAY_S
                say(f"still waiting for the GPU worker on {self.endpoint} ({waited:.0f} s)")
        assert self.ready is not None
        return self.ready

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.up = False  # no loss to report: this side closes
        self._lost("the front end closes")
        if not self._sock.closed:
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._ctx.term()

    # -- sending -----------------------------------------------------------------
    def _send(self, msg: m.Down) -> None:
        """Send now, or raise ``zmq.Again`` (no worker connected)."""
        if not self._connected:
            raise zmq.Again()
        sent_now(self._sock.send(m.encode(msg), flags=zmq.DONTWAIT))

    def _try_send(self, msg: m.Down) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._send(msg)

    # -- requests ----------------------------------------------------------------
    @contextlib.contextmanager
    def request(self, msg: m.Synthesize) -> Iterator[_Stream]:
        """Send ``msg`` and give its stream; on leaving early, ``Cancel`` it."""
        if not self.up:
            raise EngineLost(f"the GPU worker is down: {self.why_down}")
        if msg.request_id in self._streams:
            raise EngineFailed(f"request {msg.request_id} is already running")
        stream = self._streams[msg.request_id] = _Stream()
        try:
            try:
                self._send(msg)
            except zmq.ZMQError as exc:
                raise EngineLost(f"the GPU worker is unreachable: {exc}") from None
            yield stream
        finally:
            self._streams.pop(msg.request_id, None)
            if not stream.finished:
                self._try_send(m.Cancel(request_id=msg.request_id))

    async def call(self, msg: m.MakeVoice | m.DropVoice, timeout_s: float = 300.0) -> None:
        """Send ``msg`` and wait for its ``End``; its ``Failed`` raises the error."""
        if not self.up:
            raise EngineLost(f"the GPU worker is down: {self.why_down}")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._calls[msg.request_id] = fut
        try:
            try:
                self._send(msg)
            except zmq.ZMQError as exc:
                raise EngineLost(f"the GPU worker is unreachable: {exc}") from None
            async with asyncio.timeout(timeout_s):  # not wait_for: cpython#86296
                await fut
        finally:
            self._calls.pop(msg.request_id, None)

    def next_call_id(self) -> str:
        self._call_ids += 1
        return f"admin-{os.getpid()}-{self._call_ids}"

    def active(self, family: str) -> int:
        """Requests the worker said it holds for ``family`` (last ``Load``)."""
        return self.load.active.get(family, 0) if self.load is not None else 0

    def capacity(self, family: str) -> int:
        return self.ready.capacity.get(family, 0) if self.ready is not None else 0

    def starting(self, family: str) -> int:
        """First segments of ``family`` waiting in the worker for their first
        output, every front end's (last ``Load``)."""
        return self.load.starting.get(family, 0) if self.load is not None else 0

    def starting_elsewhere(self, family: str) -> int:
        """Those of other front ends: ``starting`` less this one's share, both
        from the same ``Load`` (this front end's own starts are its core's)."""
        load = self.load
        if load is None:
            return 0
        return max(0, load.starting.get(family, 0) - load.starting_yours.get(family, 0))

    def rtf(self, family: str) -> float | None:
        """The r of ``family``'s requests completed in the worker lately, every
        front end's (last ``Load``); None before any."""
        return self.load.rtf.get(family) if self.load is not None else None

    # -- the worker's side -----------------------------------------------------------
    def _lost(self, why: str) -> None:
        """Fail every open request; the voices are down until a new ``Ready``."""
        if self.up:
            log.error("GPU worker at %s lost (%s): failing %d request(s)", self.endpoint, why,
                      len(self._streams))
        self.up, self.why_down, self.load = False, why, None
        for fut in self._calls.values():  # a voice being made or dropped: no answer comes
            if not fut.done():
                fut.set_exception(EngineLost(f"the GPU worker went away ({why})"))
        for rid, stream in list(self._streams.items()):
            if not stream.finished:
                stream.put(EngineLost(f"the GPU worker went away ({why})"))
                # a worker only silent for a while would go on with it
                self._try_send(m.Cancel(request_id=rid))

    def _on_ready(self, ready: m.Ready) -> None:
        before = self.ready
        if before is not None and ready.epoch != before.epoch:
            self._lost("it restarted")  # requests of the old one are gone
            log.warning("GPU worker at %s is back (pid %d)", self.endpoint, ready.pid)
        self.ready, self.up, self.why_down = ready, True, ""
        if before is not None and before.voices != ready.voices:
            self._voices_changed(before.voices, ready.voices)
        self._seen = time.monotonic()
        self._first_ready.set()

    def _on_message(self, body: bytes, extra: list[zmq.Frame]) -> None:
        msg = m.decode_up(body)
        if isinstance(msg, m.Chunk):
            stream = self._streams.get(msg.request_id)
            if stream is None or stream.finished:
                return  # cancelled here already: late output
            if not extra:
                raise ValueError("a chunk without its samples")
            samples = np.frombuffer(extra[0].buffer, dtype=np.float32)
            if msg.sent_at:
                self.chunk_delay_seconds.observe(time.monotonic() - msg.sent_at)
            if msg.model_output_at is not None:
                stream.put(msg.model_output_at)
            stream.put(PcmChunk(samples, msg.sample_rate))
            if stream.buffered_s > self.config.request_buffer_s:
                stream.put(Overloaded(f"more than {self.config.request_buffer_s:g} s of audio "
                                      "not taken; the request is cancelled"))
                self._try_send(m.Cancel(request_id=msg.request_id))
        elif isinstance(msg, (m.End, m.Failed)) and msg.request_id in self._calls:
            fut = self._calls[msg.request_id]
            if not fut.done():
                if isinstance(msg, m.End):
                    fut.set_result(None)
                else:
                    fut.set_exception(_ERRORS.get(msg.code, EngineFailed)(msg.message))
        elif isinstance(msg, (m.End, m.Failed)):
            stream = self._streams.get(msg.request_id)
            if stream is None or stream.finished:
                return
            if isinstance(msg, m.End):
                stream.put(_END)
            else:
                stream.put(_ERRORS.get(msg.code, EngineFailed)(
                    msg.message, retry_after_ms=msg.retry_after_ms))
        elif isinstance(msg, m.Voices):
            if self.ready is not None and msg.epoch == self.ready.epoch:
                before = self.ready.voices
                self.ready = msgspec.structs.replace(self.ready, voices=msg.voices)
                self._voices_changed(before, msg.voices)
        elif isinstance(msg, m.Load):
            if self.ready is None or msg.epoch != self.ready.epoch:
                self._lost("it restarted")
                return  # Hello (the heartbeat) brings the new one's Ready
            self.load, self._seen = msg, time.monotonic()
        else:
            self._on_ready(msg)

    def _voices_changed(self, before: tuple[m.VoiceEntry, ...],
                        now: tuple[m.VoiceEntry, ...]) -> None:
        if self.on_voices is not None:
            try:
                self.on_voices(before, now)
            except Exception:  # the server's bookkeeping: log, keep reading
                log.exception("applying the GPU worker's new voices failed")

    def _handle(self, frames: list[zmq.Frame]) -> None:
        try:
            self._on_message(frames[0].bytes, frames[1:])
        except Exception:  # a bad message from the worker: log, keep reading
            log.exception("unreadable message from the GPU worker")

    async def _read(self) -> None:
        while True:
            self._handle(await self._sock.recv_multipart(copy=False))

    def _drain(self) -> None:
        """Handle what the worker sent before its socket closed: its last
        chunks and failures are already queued here, and the monitor's
        disconnect can be read before them (seen once in CI: a crashed
        engine's chunk and failure lost behind the disconnect)."""
        # the same socket, read without await
        sock: zmq.Socket[Any] = zmq.Socket.shadow(self._sock.underlying)
        while True:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle(frames)

    async def _beat(self) -> None:
        """``Hello`` while the worker is away, ``Ping`` while it is up; silence
        past ``timeout_s`` is a loss (a hung worker keeps its socket open)."""
        pid = os.getpid()
        while True:
            if self.up:
                if time.monotonic() - self._seen > self.config.timeout_s:
                    self._lost(f"silent for {self.config.timeout_s:g} s")
                else:
                    self._try_send(m.Ping())
            if not self.up:
                self._try_send(m.Hello(pid=pid))
            await asyncio.sleep(self.config.heartbeat_s)

    async def _watch(self) -> None:
        """The socket's connection: a worker there (say ``Hello`` at once), or
        its disconnect: the worker's process ended (seen at once)."""
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                self._connected = True
                if not self.up:
                    self._try_send(m.Hello(pid=os.getpid()))
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._connected = False
                self._drain()
                self._lost("its socket closed")


def _info_of(entry: m.VoiceEntry) -> VoiceInfo:
    fields = {f.name for f in dataclasses.fields(VoiceInfo)}
    return VoiceInfo(**{k: v for k, v in msgspec.structs.asdict(entry).items() if k in fields})


class RemoteMaker:
    """A family's ``VoiceMaker`` in the GPU worker, through the link."""

    def __init__(self, link: WorkerLink, family: str) -> None:
        self.link = link
        self.family = family

    def _entry(self, full: str) -> m.VoiceEntry | None:
        ready = self.link.ready
        return next((e for e in ready.voices if e.name == full), None) if ready else None

    async def add(self, name: str, adapter: str, speaker: str | None = None) -> Voice:
        full = f"{self.family}:{name}"
        await self.link.call(m.MakeVoice(request_id=self.link.next_call_id(), family=self.family,
                                         name=name, adapter=adapter, speaker=speaker or ""))
        entry = self._entry(full)  # the worker's Voices came before its End
        if entry is None:
            raise EngineFailed(f"the GPU worker made {full} but does not list it")
        return RemoteVoice(self.link, _info_of(entry))

    async def remove(self, name: str) -> Voice:
        full = f"{self.family}:{name}"
        entry = self._entry(full)
        if entry is None:
            raise UnknownVoice(f"the GPU worker has no voice {full}")
        await self.link.call(m.DropVoice(request_id=self.link.next_call_id(), name=full))
        return RemoteVoice(self.link, _info_of(entry))


class RemoteVoice:
    """A voice of the GPU worker (the ``Voice`` protocol), and its health for
    the server's admission (``admit``, ``down``)."""

    def __init__(self, link: WorkerLink, info: VoiceInfo) -> None:
        self.link = link
        self._info = info

    @property
    def info(self) -> VoiceInfo:
        return self._info

    async def warm_up(self) -> None:
        """Nothing: the worker warmed its voices before it said ``Ready``."""

    async def close(self) -> None:
        """Nothing: the link closes with the voice set."""

    def down(self) -> str | None:
        """Why the voice cannot take contexts now (the worker is away), or None."""
        return None if self.link.up else f"GPU worker down: {self.link.why_down}"

    def starting_elsewhere(self) -> int:
        """Contexts of this voice's family that other front ends are starting
        in the worker now (first segments without output yet)."""
        return self.link.starting_elsewhere(self._info.family)

    def rtf_elsewhere(self) -> float | None:
        """This voice's family's r in the worker (``WorkerLink.rtf``)."""
        return self.link.rtf(self._info.family)

    def admit(self, context: str) -> None:
        """Refuse a new context while the worker is away (``engine_failed``)
        or holds its capacity of requests (``overloaded``)."""
        why = self.down()
        if why is not None:
            raise EngineUnavailable(f"voice {self._info.name}: {why}", context=context,
                                    retry_after_ms=DOWN_RETRY_MS)
        family = self._info.family
        cap = self.link.capacity(family)
        if cap and self.link.active(family) >= cap:
            raise Busy(f"the GPU serves {cap} {family} requests at once; all are taken",
                       context=context, retry_after_ms=FULL_RETRY_MS)

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        clock = request.clock
        deadline = None if request.deadline is None else \
            request.deadline - clock.now() + time.monotonic()
        msg = m.Synthesize(request_id=request.request_id, voice=self._info.name,
                           text=request.text, first=request.first, deadline=deadline,
                           want_marks=request.marks is not None,
                           log_id=current_request_id(), speed=request.speed)
        with self.link.request(msg) as stream:
            while True:
                item = await stream.get()
                if isinstance(item, PcmChunk):
                    yield item
                elif isinstance(item, float):  # the model's first output, monotonic
                    if request.marks is not None:
                        request.marks.setdefault(MODEL_OUTPUT_MARK,
                                                 item - time.monotonic() + clock.now())
                elif isinstance(item, _End):
                    return
                else:
                    raise item


class LinkCollector(Collector):
    """``rtserver_gpu_worker_up``, the worker's requests against its capacity,
    and the delay of its chunks to this front end."""

    def __init__(self, link: WorkerLink) -> None:
        self.link = link

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("rtserver_gpu_worker_up",
                               "1 while the GPU worker answers this front end")
        up.add_metric([], 1.0 if self.link.up else 0.0)
        yield up
        ready = self.link.ready
        yield from load_families(ready.capacity if ready is not None else (),
                                 active=self.link.active, capacity=self.link.capacity,
                                 starting=self.link.starting)
        yield from self.link.chunk_delay_seconds.collect()


async def load_server_voices(config: Config, progress: Callable[[str], None]) -> VoiceSet:
    """The server's voices: all in this process, or, with ``[gpu] endpoint``
    set, the GPU families' through the worker there and the rest here."""
    if not config.gpu.endpoint:
        return await load_voices(config.voice, config.families, progress)
    local, remote = split_specs(config)
    if not remote:
        return await load_voices(config.voice, config.families, progress)
    link = WorkerLink(config.gpu.endpoint, config.gpu)
    try:
        ready = await link.start(progress)
        missing = [s for s in remote if s not in ready.by_spec]
        if missing:
            raise ConfigError(f"the GPU worker does not serve {', '.join(missing)} "
                              f"(it serves {', '.join(ready.by_spec)})")
        out = VoiceSet(voices={}, default="")
        if local:
            settings = dataclasses.replace(config.voice, default=local[0],
                                           extra=tuple(local[1:]))
            out = await load_voices(settings, config.families, progress)
    except BaseException:
        await link.close()
        raise
    out.releases.append(link.close)
    out.collectors.append(LinkCollector(link))
    remote_voices = {e.name: RemoteVoice(link, _info_of(e)) for e in ready.voices}
    out.makers |= {family: RemoteMaker(link, family) for family in ready.makers}

    def watch(apply: Callable[[dict[str, Voice], list[str]], None]) -> None:
        def changed(before: tuple[m.VoiceEntry, ...], now: tuple[m.VoiceEntry, ...]) -> None:
            old, new = {e.name for e in before}, {e.name: e for e in now}
            apply({n: RemoteVoice(link, _info_of(e)) for n, e in new.items() if n not in old},
                  [n for n in old if n not in new])

        link.on_voices = changed

    out.watch = watch
    by_spec = {**out.by_spec, **{s: ready.by_spec[s] for s in remote}}
    default = by_spec[config.voice.default]
    voices = {**out.voices, **remote_voices}
    out.voices = {default: voices[default], **{n: v for n, v in voices.items() if n != default}}
    out.default, out.by_spec = default, by_spec
    return out


__all__ = ["LinkCollector", "RemoteMaker", "RemoteVoice", "WorkerLink", "load_server_voices"]
