"""Start, serve and drain: the server's life cycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from rtserver.cache import PhraseCache
from rtserver.config import Config, ServerConfig
from rtserver.errors import CloseCode, ErrorCode
from rtserver.gc_heap import freeze_heap
from rtserver.server.admin_api import AdminApi
from rtserver.server.asgi import AsgiWebSocket, RtAsgi
from rtserver.server.connection import Connection
from rtserver.server.http_api import build_http_app
from rtserver.server.limits import raise_fd_limit
from rtserver.server.openai_speech import SpeechApi
from rtserver.server.process_metrics import ProcessMetrics
from rtserver.server.process_metrics import attach as attach_process_metrics
from rtserver.server.request_ids import RequestIdMiddleware
from rtserver.server.state import AppState
from rtserver.server.token_api import TokenApi
from rtserver.server.workers import current as current_worker
from rtserver.server.workers import notify_ready
from rtserver.server.ws_protocol import budgeted_protocol
from rtserver.voices.registry import VoiceSet
from rtserver.worker.remote import load_server_voices

log = logging.getLogger("rtserver.server")


class RtServer:
    """A running server: ``await start()``, ``await drain()``, ``port``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.voice_set: VoiceSet | None = None
        self.app: AppState | None = None
        self._server: uvicorn.Server | None = None
        self._sock: socket.socket | None = None
        self._connections: set[Connection] = set()
        self._speech: SpeechApi | None = None
        self._encode_pool: ThreadPoolExecutor | None = None
        self._process_metrics = ProcessMetrics()
        self._watch: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None
        return int(self._sock.getsockname()[1])

    async def start(self, *, progress: Callable[[str], None] | None = None) -> None:
        """Load and warm the voices, then listen; ``/ready`` turns 200 at the end."""
        say = progress or (lambda msg: log.info("%s", msg))
        s = self.config.server
        before, now = raise_fd_limit(s.max_connections + s.fd_margin)
        if now != before:
            say(f"open files: soft limit raised from {before} to {now}")
        self.voice_set = await load_server_voices(self.config, progress=say)
        threads = self.config.server.encode_threads or min(8, os.cpu_count() or 1)
        self._encode_pool = ThreadPoolExecutor(threads, thread_name_prefix="opus")
        self.app = AppState(config=self.config, voices=self.voice_set.voices,
                            default_voice=self.voice_set.default, encode_pool=self._encode_pool,
                            makers=self.voice_set.makers)
        if self.voice_set.watch is not None:  # a GPU worker's voices made at run time
            self.voice_set.watch(self.app.apply_voice_changes)
        for collector in self.voice_set.collectors:
            self.app.metrics.registry.register(collector)
        app = self.app
        self._watch = asyncio.create_task(self._watch_engines(), name="engine-watch")
        connections = self._connections
        app.metrics.send_queue_audio_seconds.set_function(
            lambda: sum(c.outbox.queued_ms for c in connections) / 1000.0)
        self._process_metrics = attach_process_metrics(
            app.metrics.registry, self.config, ready=lambda: app.is_ready()[0])
        if s.reuse_port:
            # Processes sharing the port: the kernel hands connections to any
            # listener, so this one listens only once its voices are warm.
            say(f"warming up {len(self.app.voices)} voice(s)")
            await self.voice_set.warm_up()
            await self._listen()
        else:
            # One process: listen first, so /health and /ready answer while warming.
            await self._listen()
            say(f"warming up {len(self.app.voices)} voice(s)")
            await self.voice_set.warm_up()
        self.app.ready = True
        say(f"ready on ws://{s.host}:{self.port}/v1/stream")

    async def _listen(self) -> None:
        """Bind the port ourselves (SO_REUSEPORT when configured) and hand the
        socket to uvicorn: HTTP and the WebSocket on it."""
        assert self.app is not None
        s = self.config.server
        self._sock = bind_socket(s)
        cache = PhraseCache.from_config(self.config.cache, self.app.metrics.registry)
        self._speech = SpeechApi(self.app, cache)
        http_app = build_http_app(self.app, self._speech, TokenApi(self.app),
                                  AdminApi(self.app, cache))
        asgi = RequestIdMiddleware(RtAsgi(self.app, self._handle, http_app))
        config = uvicorn.Config(
            # websockets' sans-I/O protocol with an input budget per connection
            asgi, ws=budgeted_protocol(s, self.app.clock, self._flood_cut_off), http="httptools",
            lifespan="off",
            ws_max_size=s.max_message_bytes, ws_per_message_deflate=False,
            ws_ping_interval=s.ping_interval_s or None, ws_ping_timeout=s.ping_interval_s or None,
            server_header=False, date_header=False, access_log=False, log_config=None,
            timeout_graceful_shutdown=5,
            # the client address that per-address limits count (X-Forwarded-For
            # from these peers only; config.py, ServerConfig.forwarded_allow_ips)
            proxy_headers=bool(s.forwarded_allow_ips.strip()),
            forwarded_allow_ips=s.forwarded_allow_ips.strip() or None)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._sock])
        self._server = server

    async def _watch_engines(self) -> None:
        """Poll every family's engine probe (``VoiceSet.dead``): an engine that
        dies with no request in flight (a crashed loop, a killed engine
        process) takes its voices down and ends the process all the same."""
        assert self.app is not None and self.voice_set is not None
        while True:
            try:
                dead = self.voice_set.dead()
            except Exception:  # a probe's bug must not end the watch
                log.exception("reading the engines' health failed")
                dead = {}
            for voice, why in dead.items():
                self.app.engine_gone(voice, why)
            await asyncio.sleep(ENGINE_WATCH_S)

    def _flood_cut_off(self) -> None:
        """The WebSocket protocol cut off a connection over its input budget."""
        assert self.app is not None
        self.app.metrics.errors.labels(ErrorCode.RATE_LIMITED.value).inc()
        self.app.metrics.rejected.labels("control_flood").inc()

    async def _handle(self, ws: AsgiWebSocket) -> None:
        assert self.app is not None
        conn = Connection(ws, self.app)  # its slot was counted at the handshake
        self._connections.add(conn)
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)

    async def drain(self) -> None:
        """Drain: ``/ready`` answers 503 and new WebSockets and speech requests
        are refused (the listener stays up, so probes see why), open contexts
        and speech responses finish, then every connection closes with 1001."""
        if self.app is None or self._server is None:
            await self._release()
            return
        self.app.begin_drain()
        if self.config.server.reuse_port:
            # Stop accepting: the kernel routes new connections to the other
            # processes on the port (connections already accepted stay open).
            self._stop_listening()
        clock = self.app.clock
        deadline = clock.now() + self.config.server.drain_timeout_s
        while (any(c.live for c in self._connections)
               or (self._speech is not None and self._speech.in_flight)):
            if clock.now() > deadline:
                break
            await asyncio.sleep(0.05)
        await self._shut()
        await self._release()

    async def close(self) -> None:
        """Close at once (tests)."""
        if self._server is not None:
            await self._shut()
        await self._release()

    def _stop_listening(self) -> None:
        assert self._server is not None
        for listener in self._server.servers:
            listener.close()

    async def _shut(self) -> None:
        """Stop listening, close every WebSocket with 1001, then let uvicorn
        finish the HTTP connections (cancelling what is left after 5 s)."""
        assert self._server is not None
        self._stop_listening()
        # all at once: a client that does not read holds its close back for up
        # to the transport's close timeout, not everyone else's
        await asyncio.gather(*(conn.ws.close(CloseCode.GOING_AWAY, "server going away")
                               for conn in list(self._connections)), return_exceptions=True)
        await self._server.shutdown()
        if self._sock is not None:
            self._sock.close()

    async def _release(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        self._process_metrics.close()
        if self.voice_set is not None:
            await self.voice_set.close()
        if self._encode_pool is not None:
            self._encode_pool.shutdown(wait=False, cancel_futures=True)


def bind_socket(s: ServerConfig) -> socket.socket:
    """The listening socket: SO_REUSEADDR, SO_REUSEPORT when ``reuse_port``
    (several processes on one port), and the options accepted connections
    inherit from it on Linux: TCP_NODELAY (audio frames go out at once) and
    ``socket_send_buffer`` as SO_SNDBUF."""
    family = socket.AF_INET6 if ":" in s.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if s.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if s.socket_send_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, s.socket_send_buffer)
        sock.bind((s.host, s.port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_forever(config: Config, *, on_ready: Callable[[RtServer], Awaitable[None]]
                        | None = None) -> int:
    """Run until SIGINT/SIGTERM (at any time, start-up included), then drain;
    the exit status: 0, or ``ENGINE_DEAD_EXIT`` when a voice's engine died
    (drained first, so that contexts of other voices finish; the orchestrator
    restarts the process: rtserver does not restart engines in process)."""
    server = RtServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    ident = current_worker()
    name = f"rtserver[{ident.index}]" if ident is not None else "rtserver"
    starting = asyncio.create_task(
        server.start(progress=lambda m: print(f"{name}: {m}", flush=True)))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # SIGTERM while loading or warming up
        print(f"{name}: stopping during start-up", flush=True)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await server.close()
        return 0
    stopping.cancel()
    starting.result()  # a failed start raises here
    assert server.app is not None
    freeze_heap()  # what start-up made is never collected again (rtserver.gc_heap)
    notify_ready()
    if on_ready is not None:
        await on_ready(server)
    dead = asyncio.create_task(server.app.engine_dead.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([dead, stopping], return_when=asyncio.FIRST_COMPLETED)
    code = ENGINE_DEAD_EXIT if dead.done() else 0
    dead.cancel()
    stopping.cancel()
    print(f"{name}: draining" + (" (an engine died)" if code else ""), flush=True)
    await server.drain()
    return code


# Exit status after an engine died (EX_SOFTWARE of sysexits.h): not 0, so a
# supervisor or orchestrator restarts the process (docs/DEPLOY.md, exit codes).
ENGINE_DEAD_EXIT = 70
# How often the engines' probes are read: a death is acted on within this.
ENGINE_WATCH_S = 0.25
