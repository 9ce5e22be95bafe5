"""The GPU worker process: the GPU families' voices, served over ZMQ.

``rtserver worker`` loads the voices of ``[gpu] families`` through the voice
registry (as the server does in one process), warms them, binds a ROUTER on
``[gpu] endpoint`` and serves ``Voice.synthesize`` for every front end that
connects (a DEALER each). The voices' engines run their step loops in their
own threads (rtserver's torch engine) or processes (vLLM's EngineCore); this
process's event loop only moves requests in and PCM out, so nothing else in
it competes with them for the GIL.

Its contract with front ends (``messages``):

- ``Hello`` -> ``Ready`` (voices, capacity); ``Ping`` -> ``Load``. A
  change in the first segments waiting for their first output (a start
  storm, from any front end) sends every front end a ``Load`` within
  ``LOAD_PUSH_S`` (one timer, however many requests changed).
- ``Synthesize`` runs the voice's ``synthesize``; each chunk goes up as
  ``Chunk`` + its samples, then ``End``, or ``Failed`` with an error code.
  A context's first segment (``first``) over the family's capacity is refused
  at once with ``overloaded``: however many front ends there are, the GPU
  never holds more than its capacity of new contexts.
- ``Cancel`` cancels the request's task: the voice frees its engine row and
  vocoder state (the ``Voice`` contract) at its next step.
- A front end that goes away (a send to it fails: ROUTER_MANDATORY) or stays
  silent for ``timeout_s`` loses its requests: they are cancelled here (and
  failed to a silent one, which may still be listening).
- It never waits for a front end: sends do not block; a front end whose
  queue is full (``SNDHWM``) fails that request with ``overloaded``.
- A voice whose engine died (``EngineDead``, or its family's probe says so
  with no request in flight: ``VoiceSet.dead``, polled) fails its request and the
  process exits ``ENGINE_DEAD_EXIT`` (the others fail as front ends see the
  socket close); the supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Mapping

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from rtserver.clock import SYSTEM_CLOCK
from rtserver.config import Config, GpuConfig
from rtserver.errors import ConfigError, EngineDead, ErrorCode, RtError, UnknownVoice
from rtserver.gc_heap import freeze_heap
from rtserver.logs import request_scope
from rtserver.pacing.hints import HintConfig
from rtserver.pacing.rates import RtfTracker
from rtserver.voices.base import MODEL_OUTPUT_MARK, Marks, SynthesisRequest, Voice, VoiceMaker
from rtserver.voices.registry import VoiceSet, load_voices
from rtserver.worker import messages as m
from rtserver.worker.metrics import serve_metrics
from rtserver.worker.placement import capacity_of, split_specs
from rtserver.worker.profile import WorkerProfile
from rtserver.worker.sockets import sent_now

log = logging.getLogger("rtserver.worker")

# Messages queued for one front end before sends to it fail (zmq SNDHWM):
# about 40 s of 24 kHz audio in ChatTTS's 512-sample chunks for each of 64
# streams; a front end this far behind is not reading at all.
SEND_HWM = 120_000
# On exit, how long queued messages may take to go out (ms).
CLOSE_LINGER_MS = 1000
# Exit status after an engine died (as the server's, rtserver.server.app).
ENGINE_DEAD_EXIT = 70
# How often the engines' probes are read.
ENGINE_WATCH_S = 0.25
# After the requests starting (first segments without output yet) change, a
# ``Load`` goes to every front end within this long: a storm's first hints
# are computed within a few tens of ms of its first segments; the 0.25 s
# heartbeat would show them after most of those hints were sent.
LOAD_PUSH_S = 0.02


class PeerGone(Exception):
    """A send found its front end gone (EHOSTUNREACH with ROUTER_MANDATORY)."""


@dataclasses.dataclass
class _Request:
    peer: bytes
    family: str
    task: asyncio.Task[None]
    starting: bool = False  # a first segment, its first output not sent yet


class WorkerServer:
    """Serves ``voices`` on a bound ROUTER socket until ``stop`` is set."""

    def __init__(self, voices: Mapping[str, Voice], *, by_spec: Mapping[str, str], default: str,
                 capacity: Mapping[str, int], config: GpuConfig,
                 send_hwm: int = SEND_HWM,
                 dead: Callable[[], Mapping[str, str]] = dict,
                 makers: Mapping[str, VoiceMaker] | None = None,
                 hints: HintConfig | None = None) -> None:
        self.voices = dict(voices)
        self._dead = dead  # voice -> why its engine is gone for good (VoiceSet.dead)
        self.makers = dict(makers or {})  # family -> its maker of voices at run time
        self._admin_tasks: set[asyncio.Task[None]] = set()
        # voices dropped at run time: contexts that were speaking with them go on
        # (the voice itself refuses once its adapter is unloaded)
        self._dropped: dict[str, Voice] = {}
        self.send_hwm = send_hwm
        self.config = config
        self.epoch = uuid.uuid4().hex[:12]
        self.capacity = dict(capacity)
        self.active = {fam: 0 for fam in capacity}
        # first segments without output yet, per family, and per front end
        self.starting = {fam: 0 for fam in capacity}
        self._starting_of: dict[bytes, dict[str, int]] = {}
        # r of the requests completed here, per family: every front end's, so
        # a front end that has measured none yet plans with it (Load.rtf)
        self._hints = hints or HintConfig()
        self.rates = {fam: RtfTracker(self._hints) for fam in capacity}
        self.rtf_sent: dict[str, float] = {}  # the last ``rtf()``, for /metrics' thread
        self._push: asyncio.TimerHandle | None = None  # the pending Load to every front end
        self.ready = m.Ready(
            epoch=self.epoch, pid=os.getpid(),
            voices=self._entries(), by_spec=dict(by_spec), default=default,
            capacity=self.capacity, makers=tuple(self.makers))
        self._requests: dict[tuple[bytes, str], _Request] = {}
        self._seen: dict[bytes, float] = {}  # front end -> when it last spoke
        # connections that said Hello: a request on another one was queued for
        # a worker before this one (a front end's pipe outlives a disconnect)
        self._greeted: set[bytes] = set()
        self._owed: list[tuple[bytes, m.Failed]] = []  # failures a full queue held back
        self.engine_dead = asyncio.Event()
        self._sock: zmq.asyncio.Socket | None = None

    def _entries(self) -> tuple[m.VoiceEntry, ...]:
        return tuple(m.VoiceEntry(**{f: getattr(v.info, f) for f in m.VoiceEntry.__struct_fields__})
                     for v in self.voices.values())

    # -- voices made at run time ------------------------------------------------
    async def _admin(self, peer: bytes, msg: m.MakeVoice | m.DropVoice) -> None:
        """Make or drop a voice; every front end heard from gets ``Voices``
        first, then the asking one ``End`` (or ``Failed`` with the reason)."""
        try:
            if isinstance(msg, m.MakeVoice):
                maker = self.makers.get(msg.family)
                if maker is None:
                    raise UnknownVoice(f"the GPU worker makes no {msg.family!r} voices "
                                       f"(it makes: {', '.join(self.makers) or 'none'})")
                voice = await maker.add(msg.name, msg.adapter, msg.speaker or None)
                self.voices[voice.info.name] = voice
                self._dropped.pop(voice.info.name, None)
            else:
                family, _, short = msg.name.partition(":")
                maker = self.makers.get(family)
                if maker is None or msg.name not in self.voices:
                    raise UnknownVoice(f"the GPU worker made no voice {msg.name[:80]!r}")
                await maker.remove(short)
                dropped = self.voices.pop(msg.name, None)
                if dropped is not None:
                    self._dropped[msg.name] = dropped
        except RtError as exc:
            self._send_failed(peer, m.Failed(request_id=msg.request_id, code=exc.code.value,
                                             message=exc.message))
            return
        self.ready = msgspec.structs.replace(self.ready, voices=self._entries())
        news = m.Voices(epoch=self.epoch, voices=self.ready.voices)
        for other in list(self._seen):
            with contextlib.suppress(zmq.Again, PeerGone):
                self._send(other, news)
        with contextlib.suppress(zmq.Again, PeerGone):
            self._send(peer, m.End(request_id=msg.request_id))

    # -- sending: never waits -------------------------------------------------
    def _send(self, peer: bytes, msg: m.Up, samples: np.ndarray | None = None) -> None:
        """Send now or raise: ``zmq.Again`` (the front end's queue is full) or
        ``PeerGone``."""
        assert self._sock is not None
        frames: list[object] = [peer, m.encode(msg)]
        if samples is not None:
            frames.append(np.ascontiguousarray(samples, dtype=np.float32))  # sent in place
        try:
            sent_now(self._sock.send_multipart(frames, flags=zmq.DONTWAIT, copy=False))
        except zmq.Again:
            raise
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerGone(peer) from None
            raise

    def _send_failed(self, peer: bytes, msg: m.Failed) -> None:
        try:
            self._send(peer, msg)
        except zmq.Again:
            self._owed.append((peer, msg))
        except PeerGone:
            self._drop_peer(peer, "gone")

    # -- requests -------------------------------------------------------------
    def _start(self, peer: bytes, msg: m.Synthesize) -> None:
        key = (peer, msg.request_id)
        voice = self.voices.get(msg.voice) or self._dropped.get(msg.voice)
        if voice is None:
            self._send_failed(peer, m.Failed(request_id=msg.request_id,
                                             code=ErrorCode.UNKNOWN_VOICE.value,
                                             message=f"the GPU worker has no voice {msg.voice}"))
            return
        if key in self._requests:
            return  # a duplicate (the front end resent): the first one runs
        family = voice.info.family
        cap = self.capacity.get(family, 0)
        if msg.first and cap and self.active.get(family, 0) >= cap:
            self._send_failed(peer, m.Failed(
                request_id=msg.request_id, code=ErrorCode.OVERLOADED.value,
                message=f"the GPU worker serves {cap} {family} requests at once",
                retry_after_ms=250))
            return
        self.active[family] = self.active.get(family, 0) + 1
        with request_scope(msg.log_id):  # its log lines carry its context's id
            task = asyncio.create_task(self._run(peer, voice, msg),
                                       name=f"request {msg.request_id}")
        self._requests[key] = req = _Request(peer, family, task)
        # a done callback, not _run's finally: a task cancelled before it first
        # ran (its Cancel read in the same batch) never runs its body
        task.add_done_callback(lambda _: self._finished(key, req))
        if msg.first:
            self._set_starting(req, True)

    async def _run(self, peer: bytes, voice: Voice, msg: m.Synthesize) -> None:
        rid = msg.request_id
        marks = Marks(SYSTEM_CLOCK) if msg.want_marks else None
        # front ends number requests each on their own: the engines see the
        # front end's identity too, so two front ends' ids never meet there
        request = SynthesisRequest(text=msg.text, request_id=f"{peer.hex()}/{rid}",
                                   first=msg.first,
                                   deadline=msg.deadline, marks=marks, clock=SYSTEM_CLOCK,
                                   speed=msg.speed)
        mark_sent = marks is None
        first_out = msg.first
        began, audio_s = time.monotonic(), 0.0
        try:
            async with contextlib.aclosing(voice.synthesize(request)) as chunks:
                async for chunk in chunks:
                    at = None
                    if not mark_sent and marks is not None and MODEL_OUTPUT_MARK in marks:
                        at, mark_sent = marks[MODEL_OUTPUT_MARK], True
                    self._send(peer, m.Chunk(request_id=rid, sample_rate=chunk.sample_rate,
                                             sent_at=time.monotonic(), model_output_at=at),
                               chunk.samples)
                    audio_s += len(chunk.samples) / chunk.sample_rate
                    if first_out:
                        first_out = False
                        self._output_began(peer, rid)
            self._send(peer, m.End(request_id=rid))
            self._observe(voice.info.family, time.monotonic() - began, audio_s)
        except zmq.Again:
            log.warning("front end %s does not keep up: request %s fails", peer.hex(), rid)
            self._send_failed(peer, m.Failed(
                request_id=rid, code=ErrorCode.OVERLOADED.value,
                message="the front end fell behind the GPU worker"))
        except PeerGone:
            self._drop_peer(peer, "gone")
        except RtError as exc:
            self._send_failed(peer, m.Failed(request_id=rid, code=exc.code.value,
                                             message=exc.message,
                                             retry_after_ms=exc.retry_after_ms))
            if isinstance(exc, EngineDead):
                log.critical("voice %s: its engine died (%s); the worker exits",
                             voice.info.name, exc)
                self.engine_dead.set()
        except Exception as exc:  # a voice's fault fails this request only
            log.exception("request %s failed", rid)
            self._send_failed(peer, m.Failed(request_id=rid, code=ErrorCode.ENGINE_FAILED.value,
                                             message=f"voice failed: {exc}"))

    def _finished(self, key: tuple[bytes, str], req: _Request) -> None:
        """``req`` ended (or was cancelled before it ran): its slot is free."""
        if self._requests.get(key) is req:
            del self._requests[key]
            self.active[req.family] -= 1
            self._set_starting(req, False)

    # -- starts: what a storm has queued here ---------------------------------
    def _output_began(self, peer: bytes, request_id: str) -> None:
        req = self._requests.get((peer, request_id))
        if req is not None:
            self._set_starting(req, False)

    def _set_starting(self, req: _Request, starting: bool) -> None:
        if req.starting == starting:
            return
        req.starting = starting
        step = 1 if starting else -1
        self.starting[req.family] = self.starting.get(req.family, 0) + step
        mine = self._starting_of.setdefault(req.peer, {})
        mine[req.family] = mine.get(req.family, 0) + step
        if not any(mine.values()):
            del self._starting_of[req.peer]
        if self._push is None:  # one timer for every change within LOAD_PUSH_S
            self._push = asyncio.get_running_loop().call_later(LOAD_PUSH_S, self._push_load)

    # -- rates: what every front end's requests measured -----------------------
    def _observe(self, family: str, gen_s: float, audio_s: float) -> None:
        """A request of ``family`` made ``audio_s`` of audio in ``gen_s`` (the
        worker never waits for a front end, so all of it is the GPU's), while
        it and the others held here ran."""
        if audio_s <= 0:
            return
        tracker = self.rates.get(family)
        if tracker is None:  # a family outside ``capacity`` (as ``active`` allows)
            tracker = self.rates[family] = RtfTracker(self._hints)
        tracker.observe(gen_s, audio_s, time.monotonic(), load=self.active.get(family, 0))

    def rtf(self) -> dict[str, float]:
        """Per family with a request completed: the ``[hints] percentile`` of
        its recent requests' r at the load held now (``RtfTracker.percentile``);
        kept as ``rtf_sent`` for /metrics, whose thread must not read the trackers."""
        now = time.monotonic()
        self.rtf_sent = {fam: t.percentile(now=now, load=self.active.get(fam, 0))
                         for fam, t in self.rates.items() if t.count}
        return self.rtf_sent

    def _load_for(self, peer: bytes, rtf: dict[str, float]) -> m.Load:
        return m.Load(epoch=self.epoch, active=dict(self.active), capacity=self.capacity,
                      starting=dict(self.starting),
                      starting_yours=dict(self._starting_of.get(peer, {})), rtf=rtf)

    def _push_load(self) -> None:
        """Every front end heard from gets the load now (the starts changed)."""
        self._push = None
        if self._sock is None or self._sock.closed:
            return
        rtf = self.rtf()  # once for every front end
        for peer in list(self._seen):
            try:
                self._send(peer, self._load_for(peer, rtf))
            except zmq.Again:
                pass  # its queue is full: its next Ping's answer says it
            except PeerGone:
                self._drop_peer(peer, "gone")

    @property
    def frontends(self) -> int:
        """Front ends heard from within the silence timeout."""
        return len(self._seen)

    def _cancel(self, peer: bytes, request_id: str) -> None:
        """Cancel the request and give its slot back now: the front end may
        start its context's next request in the same batch (a dropped
        speculative first segment, then the segment cut), which its engine
        queues behind the row still unwinding rather than refuses."""
        key = (peer, request_id)
        req = self._requests.get(key)
        if req is not None:
            req.task.cancel()
            self._finished(key, req)

    def _drop_peer(self, peer: bytes, why: str, *, tell: bool = False) -> None:
        """A front end went away: cancel its requests (they free their rows).
        ``tell``: it may still be there (it was only silent), so each request
        is failed to it too, rather than left waiting for ever."""
        self._seen.pop(peer, None)
        if not tell:  # gone for good (a silent one may speak again, greeted)
            self._greeted.discard(peer)
        self._owed = [(p, f) for p, f in self._owed if p != peer]
        gone = [(rid, r) for (p, rid), r in self._requests.items() if p == peer]
        if gone:
            log.warning("front end %s %s: cancelling its %d request(s)", peer.hex(), why,
                        len(gone))
        for rid, req in gone:
            req.task.cancel()
            if tell:
                with contextlib.suppress(zmq.ZMQError, PeerGone):
                    self._send(peer, m.Failed(request_id=rid, code=ErrorCode.ENGINE_FAILED.value,
                                              message=f"the GPU worker dropped this front end "
                                                      f"({why})"))

    # -- the loop ---------------------------------------------------------------
    def _handle(self, peer: bytes, body: bytes) -> None:
        try:
            msg = m.decode_down(body)
        except Exception:  # msgspec.DecodeError / ValidationError: a bad peer
            log.warning("front end %s sent an unreadable message", peer.hex())
            return
        self._seen[peer] = time.monotonic()
        if isinstance(msg, (m.Synthesize, m.MakeVoice, m.DropVoice)) and peer not in self._greeted:
            # meant for the worker before this one: its front end failed it already
            log.warning("front end %s: request %s before Hello, refused", peer.hex(),
                        msg.request_id)
            self._send_failed(peer, m.Failed(
                request_id=msg.request_id, code=ErrorCode.ENGINE_FAILED.value,
                message="the GPU worker restarted; say Hello first"))
        elif isinstance(msg, m.Synthesize):
            self._start(peer, msg)
        elif isinstance(msg, m.Cancel):
            self._cancel(peer, msg.request_id)
        elif isinstance(msg, (m.MakeVoice, m.DropVoice)):
            task = asyncio.create_task(self._admin(peer, msg), name=f"admin {msg.request_id}")
            self._admin_tasks.add(task)
            task.add_done_callback(self._admin_tasks.discard)
        elif isinstance(msg, m.Ping):
            with contextlib.suppress(zmq.Again, PeerGone):
                self._send(peer, self._load_for(peer, self.rtf()))
        else:  # Hello
            self._greeted.add(peer)
            with contextlib.suppress(zmq.Again, PeerGone):
                self._send(peer, self.ready)

    async def _janitor(self) -> None:
        """Drop silent front ends; send the failures a full queue held back."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            now = time.monotonic()
            for peer, seen in list(self._seen.items()):
                if now - seen > self.config.timeout_s:
                    self._drop_peer(peer, f"silent for {now - seen:.1f} s", tell=True)
            owed, self._owed = self._owed, []
            for peer, failed in owed:
                self._send_failed(peer, failed)

    async def _watch_engines(self) -> None:
        """An engine that dies with no request in flight ends the worker too."""
        while not self.engine_dead.is_set():
            try:
                dead = self._dead()
            except Exception:  # a probe's bug must not end the watch
                log.exception("reading the engines' health failed")
                dead = {}
            for voice, why in dead.items():
                log.critical("voice %s: its engine died (%s); the worker exits", voice, why)
                self.engine_dead.set()
            await asyncio.sleep(ENGINE_WATCH_S)

    async def serve(self, endpoint: str, stop: asyncio.Event,
                    on_listening: Callable[[], None] = lambda: None) -> int:
        """Bind ``endpoint`` and serve until ``stop`` (0) or an engine died
        (``ENGINE_DEAD_EXIT``)."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, self.send_hwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        self._sock = sock
        on_listening()
        janitor = asyncio.create_task(self._janitor())
        watch = asyncio.create_task(self._watch_engines())
        stopping = asyncio.create_task(stop.wait())
        dead = asyncio.create_task(self.engine_dead.wait())
        try:
            while True:
                recv = asyncio.ensure_future(sock.recv_multipart())
                await asyncio.wait([recv, stopping, dead], return_when=asyncio.FIRST_COMPLETED)
                if not recv.done():
                    recv.cancel()
                    break
                frames = recv.result()
                if len(frames) == 2:
                    self._handle(frames[0], frames[1])
                # drain what else is there without waiting (a burst of pings)
                while True:
                    try:
                        frames = await sock.recv_multipart(flags=zmq.DONTWAIT)
                    except zmq.Again:
                        break
                    if len(frames) == 2:
                        self._handle(frames[0], frames[1])
        finally:
            for task in (janitor, watch, stopping, dead):
                task.cancel()
            if self._push is not None:
                self._push.cancel()
                self._push = None
            tasks = [r.task for r in self._requests.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # a second for the last failures to reach the front ends (an
            # engine's death: its message says more than the disconnect)
            sock.close(linger=CLOSE_LINGER_MS)
            ctx.term()
        return ENGINE_DEAD_EXIT if self.engine_dead.is_set() else 0


async def load_worker_voices(config: Config, say: Callable[[str], None]) -> VoiceSet:
    """Load and warm the GPU families' voices of ``config``."""
    _, specs = split_specs(config)
    if not specs:
        raise ConfigError(f"the GPU worker serves the families {', '.join(config.gpu.families)}"
                          " but no configured voice is of them")
    settings = dataclasses.replace(config.voice, default=specs[0], extra=tuple(specs[1:]))
    voice_set = await load_voices(settings, config.families, progress=say)
    try:
        say(f"warming up {len(voice_set.voices)} voice(s)")
        await voice_set.warm_up()
    except BaseException:
        await voice_set.close()
        raise
    return voice_set


async def run_worker(config: Config, on_ready: Callable[[], None] = lambda: None,
                     say: Callable[[str], None] | None = None) -> int:
    """``rtserver worker``: load, warm, serve ``[gpu] endpoint`` until SIGTERM."""
    endpoint = config.gpu.endpoint
    if not endpoint:
        raise ConfigError("the GPU worker needs gpu.endpoint (the supervisor sets it)")
    say = say or (lambda msg: print(f"rtserver gpu worker: {msg}", flush=True))
    sys.setswitchinterval(config.gpu.gil_switch_ms / 1000)  # the engine thread's GIL waits
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    voice_set = await load_worker_voices(config, say)
    frozen = freeze_heap()  # the GIL never waits on collections of start-up's objects
    say(f"{frozen} objects frozen out of garbage collection")
    try:
        families = {v.info.family for v in voice_set.voices.values()}
        server = WorkerServer(voice_set.voices, by_spec=voice_set.by_spec,
                              default=voice_set.default,
                              capacity={f: capacity_of(config, f) for f in families},
                              config=config.gpu, dead=voice_set.dead,
                              makers=voice_set.makers, hints=config.hints)

        metrics = serve_metrics(config, voice_set.collectors, server)
        if config.gpu.profile_dir:
            WorkerProfile(config.gpu.profile_dir, voice_set.profiled).install(loop)

        def listening() -> None:
            say(f"ready on {endpoint} (epoch {server.epoch}, capacity "
                + ", ".join(f"{f} {c or 'unbounded'}" for f, c in server.capacity.items()) + ")")
            on_ready()

        try:
            return await server.serve(endpoint, stop, on_listening=listening)
        finally:
            if metrics is not None:
                metrics.shutdown()
                metrics.server_close()
    finally:
        await voice_set.close()


__all__ = ["ENGINE_DEAD_EXIT", "WorkerServer", "load_worker_voices", "run_worker"]
